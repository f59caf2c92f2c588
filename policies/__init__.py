"""The ready-made retention policies, installed as ``s3ckpt.policies``.

The ``*.toml`` files beside this module ship in the wheel as package data (pyproject.toml maps
this directory to ``s3ckpt.policies``); ``load_policy("pretraining")`` and
``s3ckpt prune --policy pretraining`` read them by name through :mod:`importlib.resources`.
"""
