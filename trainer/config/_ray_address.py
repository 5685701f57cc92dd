"""What a Ray cluster address may be, decided once for the configuration and the backend.

``rollout.ray_address`` (``--ray-address``) and ``RAY_ADDRESS`` take the forms a Ray driver
joins with: ``auto`` (a cluster running on this machine), ``local`` (a new instance of this
run's own), ``HOST[:PORT]`` (a head's GCS, port 6379 by default) or ``ray://HOST[:PORT]``
(its Ray Client server, port 10001). The configuration refuses anything else before the run
folder is made (one line, exit status 2): a mistyped port found only once the run has
started leaves a run folder and an exit status that say the run failed, not the flag. The
backend probes the host and port parsed here before ``ray.init`` (:mod:`..rollout.ray._session`).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = ["CLIENT_PORT", "GCS_PORT", "RayAddress", "check_ray_address", "parse_ray_address"]

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
