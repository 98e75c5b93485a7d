"""Fuzzing braze's inputs: model files, embedder directories, CLI arguments and chat
templates, mutated by hypothesis strategies (``mutators.py``) from small real-shaped
bases (``corpus.py``), each case run and classified (``targets.py``). A few hundred
cases run in ``make test`` (``test_fuzz.py``); ``make fuzz`` runs the long campaign
(``campaign.py``) and prints counts by outcome."""
