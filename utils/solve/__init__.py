"""A user's solve (layer above utils/eval/ and utils/viz/; imports them, utils/data/, models/ and the floor, never the
trainers or the page): the bundled models, pre-checks, test-time search, anytime rounds, precision, answers.csv and
the Python API's internals."""
