"""Input pipelines behind one interface. Importing this package registers the built-in adapters.

Adapter modules keep heavy imports (DALI, the INR codec) inside their classes, so
``import pipelines`` works on a machine without them.
"""

# Built-in adapters (each module registers itself; heavy imports stay inside the classes).
from pipelines import dali, inr, raw, torch_jpeg, torch_nvjpeg  # noqa: E402, F401
from pipelines.base import (  # noqa: F401
    Augment,
    Batch,
    Pipeline,
    PipelineConfig,
    Unavailable,
    create,
    names,
    needs_store,
    pipeline_class,
    register,
)
