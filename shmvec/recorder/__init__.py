"""Recording's machinery, under :mod:`shmvec.recording` (the public entry): video clips encoded
from the render frames workers write into a tape (:mod:`shmvec.recorder.video`,
:mod:`shmvec.recorder.clip`), Minari datasets written by a side process from the steps workers write
into one (:mod:`shmvec.recorder.dataset`), and the faces' wrappers (:mod:`shmvec.recorder.sb3`,
:mod:`shmvec.recorder.gymnasium`)."""
