"""pytest (nbval) runs the labs at CI size, with the reference solutions (see fsdp_mini.labs)."""

import os

# Note: set before nbval starts the kernels, which inherit the environment.
os.environ.setdefault("CI", "true")
