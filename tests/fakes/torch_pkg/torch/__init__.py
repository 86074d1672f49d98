"""A fake ``torch`` for the tests: ``torch.cuda.set_per_process_memory_fraction`` records each
call, as a JSON line ``[fraction, device]``, in the file ``FAKE_TORCH_CALLS`` names.

Put ``tests/fakes/torch_pkg`` first on ``sys.path`` (``PYTHONPATH``) of the process under test.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace


def _set_per_process_memory_fraction(fraction: float, device: object = None) -> None:
    """Record the call (torch's signature: a fraction in 0..1, then the device)."""
    if not 0 <= fraction <= 1:
        raise ValueError(f"fraction {fraction} out of 0..1")  # as torch refuses it
    with open(os.environ["FAKE_TORCH_CALLS"], "a", encoding="utf-8") as out:
        out.write(json.dumps([fraction, device]) + "\n")


cuda = SimpleNamespace(set_per_process_memory_fraction=_set_per_process_memory_fraction)
