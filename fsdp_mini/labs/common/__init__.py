"""What every lab uses: one configuration cell, exercises with hidden solutions, checkers' reports.

``config.py`` (``lab_config``: how many ranks, which backend, how big a model), ``exercise.py``
(the learner's function or the reference solution), ``report.py`` (``CheckResult``: ✔/✘ lines in
plain words), the checking engine: ``differential.py`` (a check: the learner's code beside the
reference over a spread of configurations), ``records.py`` (configurations, what a run saw),
``compare.py`` (the first divergence, in words), ``on_ranks.py`` (many answers on ranks, one
launch per world size), ``observing.py`` (the small nets and what a training run shows),
``hints.py`` and ``facts.py`` (what a divergence says in numbers, for the hints),
``plan_search.py`` (a planner search beside the reference: lab 07 and the assessment; its
candidates in ``plan_candidates.py``, its hints' facts in ``plan_facts.py``),
``remembered.py`` (the reference's records kept on disk), ``progress.py`` (each check's verdict
for the instructor);
``checking.py`` (a failure's line in the learner's code, unwritten stubs), ``configurations.py``
(a training configuration in words). May import: the engine, never a lab.
"""
