"""The test bed's one error type.

Why a module of its own: every part of the driver raises it and the command line catches it,
printing one line that names the problem and the fix instead of a traceback.
"""


class TestbedError(Exception):
    """A problem the user can fix; printed as one line naming it and the fix."""
