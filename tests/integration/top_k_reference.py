"""Top-k hits with numpy, for test_toolbox: the label's position in a stable descending sort of
each row's logits (np.argsort(-z, kind="stable")), a hit when it is below k.

Arguments: LOGITS.npy (float32 [..., classes]) LABELS.npy (integers [...]) K. Prints
{"hits": H, "labels": N}.
"""
import json
import sys

import numpy as np

logits = np.load(sys.argv[1])
labels = np.load(sys.argv[2])
k = int(sys.argv[3])
z = logits.reshape(-1, logits.shape[-1])
y = labels.reshape(-1)
assert z.shape[0] == y.shape[0], (z.shape, y.shape)
order = np.argsort(-z, axis=1, kind="stable")
rank = np.argmax(order == y[:, None], axis=1)
print(json.dumps({"hits": int((rank < k).sum()), "labels": int(y.shape[0])}))
