"""UUID texts made without uuid.UUID objects are the uuid module's texts."""

from __future__ import annotations

import random
import uuid

from tessera.api.uids import uuid5_url, uuid_text


def test_uuid_texts_are_the_uuid_modules() -> None:
    rng = random.Random(16)
    for i in range(5000):
        n = rng.getrandbits(128)
        assert uuid_text(n, 4) == str(uuid.UUID(int=n, version=4))
        name = f"tessera-sim/pod/ns-{i}/pód-{n:x}"
        assert uuid5_url(name) == str(uuid.uuid5(uuid.NAMESPACE_URL, name))
    # Known values: the simulation's UIDs of pod default/a and a shareID drawn with seed 0.
    assert uuid5_url("tessera-sim/pod/default/a") == str(
        uuid.uuid5(uuid.NAMESPACE_URL, "tessera-sim/pod/default/a")
    )
    assert uuid_text(0, 4) == "00000000-0000-4000-8000-000000000000"
    assert uuid_text(2**128 - 1, 5) == "ffffffff-ffff-5fff-bfff-ffffffffffff"
