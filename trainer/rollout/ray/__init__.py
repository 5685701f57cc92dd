"""The Ray rollout backend: rollout workers as Ray actors (``--backend ray``).

Importing this package imports Ray; nothing else in trainbus does until this backend is
chosen.
"""
