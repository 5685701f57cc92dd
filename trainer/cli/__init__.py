"""The ``trainbus`` command line: argument parsing, ``train``, ``report``, ``events``, the
live and plain progress views.

The top of the stack: may import every other subpackage; nothing imports it (but
``trainer``'s public face re-exports ``PlainProgress``).
"""
