"""Which packages the distribution holds (the rest of the metadata is in pyproject.toml).

The client tools live in ``client/`` in the checkout but install as ``rpcsrv.client``, so that the
only top-level package a user gets is ``rpcsrv`` (a top-level ``client`` would collide with other
distributions).  ``find_packages`` keeps new packages in without a list to maintain."""

from setuptools import find_packages, setup

CLIENT = [f"rpcsrv.{name}" for name in find_packages(include=["client", "client.*"])]
setup(packages=find_packages(include=["rpcsrv", "rpcsrv.*"]) + CLIENT, package_dir={"rpcsrv.client": "client"})
