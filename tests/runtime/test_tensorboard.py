import struct

from deeppod.runtime.tensorboard import EventWriter, crc32c, read_records


def test_crc32c_known_answer():
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(b"") == 0


def test_event_file_round_trip(tmp_path):
    w = EventWriter(tmp_path)
    w.scalars(5, {"loss": 0.25, "accuracy": 0.5})
    w.close()
    records = read_records(w.path)  # every CRC checked
    assert len(records) == 2
    assert b"brain.Event:2" in records[0]
    assert b"loss" in records[1] and b"accuracy" in records[1]
    assert struct.pack("<f", 0.25) in records[1]
    assert w.path.name.startswith("events.out.tfevents.")
