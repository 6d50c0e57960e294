"""Input pipelines behind one interface. Importing this package registers the built-in adapters
(heavy imports, DALI and the INR codec, stay inside their classes)."""

from pipelines import dali, inr, raw, torch_jpeg, torch_nvjpeg  # noqa: F401
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
