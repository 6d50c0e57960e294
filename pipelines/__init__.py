"""Input pipelines behind one interface. Importing this package registers the built-in adapters.

Adapter modules keep heavy imports (DALI, the INR codec) inside their classes, so
``import pipelines`` works on a machine without them.
"""

from pipelines.base import (  # noqa: F401
    Augment,
    Batch,
    Pipeline,
    PipelineConfig,
    Unavailable,
    create,
    names,
    register,
)
