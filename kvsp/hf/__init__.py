"""The Hugging Face transformers side of kvsp (decision D6): reference model, descriptor, engine.

Importing this package needs no torch: `descriptor_from_model_dir` reads only files.  The engine
(`kvsp.hf.engine.HfModel`, `HfEngine`) and the reference model writer (`kvsp.hf.refmodel.init_model`)
import torch and transformers; they come with the ``engine`` extra.
"""

from kvsp.hf.descriptor import descriptor_from_model_dir

__all__ = ["descriptor_from_model_dir"]
