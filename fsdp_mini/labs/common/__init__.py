"""What every lab uses: one configuration cell, exercises with hidden solutions, checkers' reports.

``config.py`` (``lab_config``: how many ranks, which backend, how big a model), ``exercise.py``
(the learner's function or the reference solution), ``report.py`` (``CheckResult``: ✔/✘ lines in
plain words), ``checking.py`` (running the learner's code on ranks, a failure as one ✘ line, and
comparing ranks), ``interactive.py`` and ``ranks_keeper.py`` (ranks that stay alive across
cells), ``render.py`` (executed HTML copies of the labs). May import: the engine, never a lab.
"""
