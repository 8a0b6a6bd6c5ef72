"""The version of streamsafe, written here only: the package metadata reads it at build time
(pyproject.toml, ``[tool.setuptools.dynamic]``), ``streamsafe --version`` and
``streamsafe.__version__`` at run time; CHANGELOG.md names each release."""

__version__ = "0.1.0"
