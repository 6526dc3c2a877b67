import os

# Tests never reach the model hub: names outside the catalogue fail fast instead of retrying.
os.environ["HF_HUB_OFFLINE"] = "1"

TINY_MODEL = "google/bert_uncased_L-2_H-128_A-2"
