"""The papers' evaluation protocols and the rollout mechanics under every evaluation (layer above models/ and
utils/run/; imports them, utils/data/ and the floor, never utils/solve/, the trainers or the page): exact accuracy and
its bands, ARC's voting pass@K, PCK@0.2, intervals, test-time compute over segments, rollouts and views, and the
loading of a trained model."""
