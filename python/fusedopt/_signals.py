"""What the parts of a step raise to each other (not to the user): a step packed again, a step skipped."""


class _Relaid(Exception):
    """FlatStore.combine() ran while a step was being packed."""


def packed_anew_until_laid_out(pack):
    """pack() again from the start for as long as flatten=True lays its buffers out anew (_Relaid): the segments
    packed so far point into the old layout."""
    while True:
        try:
            return pack()
        except _Relaid:
            pass


class _Skipped(Exception):
    """The step's pre-pass found non-finite gradients: nothing was updated."""
