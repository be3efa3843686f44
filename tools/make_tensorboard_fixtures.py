#!/usr/bin/env python3
"""TensorBoard's verdict on qlora's event files: tests/fixtures/tensorboard/.

    /opt/fixenv/bin/python tools/make_tensorboard_fixtures.py [BUILD_DIR]   (default build/)

Runs the C++ test TensorBoard.WritesTheBytesTensorBoardRead with QLORA_TB_FIXTURE_OUT set, so
qlora's TensorBoardWriter writes its fixture events (fixed wall times) into a temporary directory;
reads that file with TensorBoard's own EventAccumulator (tensorboard 2.20.0: pip install
tensorboard==2.20.0); copies the file to tests/fixtures/tensorboard/scalars.tfevents and writes what
TensorBoard read (every scalar's tag, step, value and wall time) to tensorboard_read.json. The C++
test then requires the writer to produce those exact bytes and its own reader to see the same scalars.
"""
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

import tensorboard
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
OUT = os.path.join(ROOT, "tests", "fixtures", "tensorboard")


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build")
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, QLORA_TB_FIXTURE_OUT=tmp)
        subprocess.run([os.path.join(build, "test_train"), "--gtest_filter=TensorBoard.WritesTheBytesTensorBoardRead"],
                       env=env, check=True, stdout=subprocess.DEVNULL)
        files = glob.glob(os.path.join(tmp, "events.out.tfevents.*"))
        assert len(files) == 1, files
        acc = EventAccumulator(tmp, size_guidance={"scalars": 0})
        acc.Reload()
        scalars = {}
        for tag in sorted(acc.Tags()["scalars"]):
            scalars[tag] = [{"step": e.step, "value": e.value, "wall_time": e.wall_time} for e in acc.Scalars(tag)]
        assert scalars, "TensorBoard found no scalars"
        os.makedirs(OUT, exist_ok=True)
        shutil.copy(files[0], os.path.join(OUT, "scalars.tfevents"))
    record = {"generator": "tools/make_tensorboard_fixtures.py", "tensorboard": tensorboard.__version__,
              "reader": "tensorboard.backend.event_processing.event_accumulator.EventAccumulator",
              "file": "scalars.tfevents", "scalars": scalars}
    with open(os.path.join(OUT, "tensorboard_read.json"), "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    for tag, points in scalars.items():
        print(tag, [(p["step"], round(p["value"], 6)) for p in points])


if __name__ == "__main__":
    main()
