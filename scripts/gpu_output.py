"""What the GPU check scripts share: writing their JSON result to `--out=PATH` as well as stdout
(mujoco.mjx prints to stdout where warp is missing, so stdout alone is not clean JSON there)."""

import json
import sys


def write_out(result: dict) -> None:
    for arg in sys.argv:
        if arg.startswith("--out="):
            with open(arg.split("=", 1)[1], "w") as f:
                json.dump(result, f, indent=1)
