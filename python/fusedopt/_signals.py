"""What the parts of a step raise to each other (not to the user): a step packed again, a step skipped."""


class _Relaid(Exception):
    """FlatStore.combine() ran while a step was being packed."""


class _Skipped(Exception):
    """The step's pre-pass found non-finite gradients: nothing was updated."""
