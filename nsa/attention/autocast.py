"""The autocast dtype of a device type, for code that casts as autocast would."""
import torch


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The dtype autocast computes in on ``device_type``, or None where it is off. A device type
    autocast does not know (``meta``, as when a model's shapes are traced on it) has it off:
    torch.is_autocast_enabled raises for it. That is asked outside a torch.compile trace only
    (some torch versions' dynamo cannot trace the question; a trace runs on real devices)."""
    if not torch.compiler.is_compiling() and not torch.amp.is_autocast_available(device_type):
        return None
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None
