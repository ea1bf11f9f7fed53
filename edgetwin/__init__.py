"""edgetwin: learn a digital twin of an edge-cloud scheduling system from its logs.

Subpackages follow the pipeline, and depend on each other in this order only:
``twin`` <- ``generative``, ``imitation`` <- ``policies`` <- ``edge``; ``cli`` on top.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("edgetwin")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0"

__all__ = ["__version__"]
