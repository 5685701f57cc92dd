"""What a Ray cluster address may be, decided once for the configuration and the backend.

``rollout.ray_address`` (``--ray-address``) and ``RAY_ADDRESS`` take the forms a Ray driver
joins with: ``auto`` (a cluster running on this machine), ``local`` (a new instance of this
run's own), ``HOST[:PORT]`` (a head's GCS, port 6379 by default) or ``ray://HOST[:PORT]``
(its Ray Client server, port 10001). The configuration refuses anything else before the run
folder is made (one line, exit status 2): a mistyped port found only once the run has
started leaves a run folder and an exit status that say the run failed, not the flag. An
address that names no host Ray could reach (``garbage``) or a head that does not answer is
refused the same way by the command line, which probes it (:func:`check_reachable`) before
the run folder is made; the backend probes it again before ``ray.init``
(:mod:`..rollout.ray._session`), for runs started from Python.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = [
    "CLIENT_PORT",
    "GCS_PORT",
    "RayAddress",
    "check_ray_address",
    "check_reachable",
    "joined_address",
    "parse_ray_address",
]

# The ports Ray listens on when an address names none: the GCS of a `ray start --head`, and
# the Ray Client server behind a ray:// address.
GCS_PORT = 6379
CLIENT_PORT = 10001


@dataclass(frozen=True, slots=True)
class RayAddress:
    """A parsed Ray address.

    Attributes:
        text: The address as given.
        host: The host it names; None for ``auto`` and ``local``.
        port: The port (the default one when it names none); None with ``host``.
    """

    text: str
    host: str | None = None
    port: int | None = None

    @property
    def local(self) -> bool:
        """``local``: a new instance of this run's own, not a cluster to join."""
        return self.text == "local"


def parse_ray_address(address: str, setting: str = "rollout.ray_address") -> RayAddress:
    """Parse ``address``; ``setting`` names where it came from in the error.

    Raises:
        ValueError: Not one of the forms above (one line naming ``setting`` and the value).
    """
    if address in ("auto", "local"):
        return RayAddress(address)
    scheme, _, rest = address.rpartition("://")
    if scheme in ("http", "https"):
        # What `ray job submit` takes (the dashboard): Ray's own refusal runs over 4 lines.
        raise ValueError(
            f"{setting} {address!r} is a dashboard (job submission) address; a driver joins "
            f"the head's GCS (HEAD:6379), ray://HEAD:10001 or auto"
        )
    where = urlsplit(f"//{rest}")
    try:
        host, port = where.hostname, where.port
    except ValueError:  # a port that is not a number from 0 to 65535
        host = port = None
    if scheme not in ("", "ray") or not host or port == 0 or where.path:
        raise ValueError(f"{setting} {address!r}: expected HOST:PORT, auto, local or ray://HOST")
    return RayAddress(address, host, port or (CLIENT_PORT if scheme == "ray" else GCS_PORT))


def check_ray_address(address: str | None, backend: str) -> None:
    """The configuration's check of ``rollout.ray_address`` (with ``rollout.backend``).

    Raises:
        ValueError: A malformed address, or an address without the ``ray`` backend.
    """
    if address is None:
        return
    parse_ray_address(address)
    if backend != "ray":
        raise ValueError(
            f"rollout.ray_address is {address!r} but rollout.backend is {backend!r}; the "
            f"address needs the ray backend (--backend ray)"
        )


def joined_address(address: str | None) -> tuple[str, str] | None:
    """The cluster a Ray driver joins, and the setting that names it: ``address``
    (``rollout.ray_address``), else the ``RAY_ADDRESS`` environment variable (how Ray users
    point every driver at their cluster); None for a local instance of the run's own
    (neither, or ``local``).

    Raises:
        ValueError: The address is malformed (naming the setting).
    """
    setting = "rollout.ray_address"
    if address is None and os.environ.get("RAY_ADDRESS"):
        address, setting = os.environ["RAY_ADDRESS"], "RAY_ADDRESS"
    if address is None or parse_ray_address(address, setting).local:
        return None
    return address, setting


def check_reachable(address: str, timeout_s: float, setting: str = "rollout.ray_address") -> None:
    """Raise at once when nothing accepts a connection at a cluster ``address``.

    ``ray.init`` retries an address it cannot reach for many minutes (about 20 attempts,
    each under gRPC's own connect timeout), on the event loop's thread and with nothing on
    screen: a mistyped address or a cluster that is down would look like a hung trainer.
    One TCP connection to the host and port tells at once. ``auto`` and ``local`` name no
    host: they are left to Ray (``auto`` fails fast when no cluster runs on this machine).

    Raises:
        ConnectionError: The address is refused, unreachable or does not resolve.
        ValueError: The address is malformed (``setting`` names where it came from).
    """
    where = parse_ray_address(address, setting)
    if where.host is None:
        return
    try:
        socket.create_connection((where.host, where.port), timeout=timeout_s).close()
    except OSError as exc:
        why = "no answer" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
        raise ConnectionError(
            f"no Ray cluster answers at {address} ({why}): check rollout.ray_address "
            f"(--ray-address, RAY_ADDRESS) and that the cluster is up (`ray status` on its head)"
        ) from None
