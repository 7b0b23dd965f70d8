# SPDX-License-Identifier: Apache-2.0
"""`shardscope run --nproc N` keeps its rendezvous on this machine: every socket its ranks
listen on (the TCPStore rank 0 serves, Gloo's pairs) is bound to 127.0.0.1, never to every
interface, since c10d's store has no authentication. A torchrun-style start with
MASTER_ADDR=127.0.0.1 (two processes started by hand) still rendezvous and trains.
"""
import glob
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import peer  # noqa: E402

BIN, ENGINE = peer.require_engine()

CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 64, "hidden_size": 16,
    "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
    "max_position_embeddings": 32, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
}
PLAN = {
    "format": "shardscope.plan", "version": 1, "name": "loopback", "api": "fsdp2", "mesh": {"shape": [2]},
    "wrap": {"policy": "module_class", "classes": ["LlamaDecoderLayer"]},
    "training": {"micro_batch_size": 1, "seq_len": 8},
}


def listening(pids):
    """(address, port) of every TCP socket in state LISTEN that one of `pids` holds, from
    /proc/net/tcp and tcp6 and each process's open descriptors."""
    inodes = set()
    for pid in pids:
        for fd in glob.glob(f"/proc/{pid}/fd/*"):
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    out = []
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        try:
            with open(table) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] != "0A" or f[9] not in inodes:  # 0A: LISTEN
                continue
            addr, port = f[1].split(":")
            raw = bytes.fromhex(addr)
            if family == socket.AF_INET:
                host = socket.inet_ntop(family, raw[::-1])
            else:
                host = socket.inet_ntop(family, b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
            out.append((host, int(port, 16)))
    return out


class Loopback(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="shardscope-loopback-")
        self.model = os.path.join(self.tmp.name, "config.json")
        self.plan = os.path.join(self.tmp.name, "plan.json")
        with open(self.model, "w") as f:
            json.dump(CONFIG, f)
        with open(self.plan, "w") as f:
            json.dump(PLAN, f)

    def tearDown(self):
        self.tmp.cleanup()

    def ranks(self):
        r = subprocess.run(["pgrep", "-f", self.plan], capture_output=True, text=True)
        return [int(p) for p in r.stdout.split()]

    def test_a_local_run_listens_on_loopback_only(self):
        p = subprocess.Popen([BIN, "run", "-m", self.model, "-p", self.plan, "--steps", "100000"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            seen, deadline = [], time.monotonic() + 60
            # Wait until the ranks have met: the store and Gloo's pairs are all listening.
            while time.monotonic() < deadline:
                seen = listening([q for q in self.ranks() if q != p.pid])
                if len(seen) >= 2:
                    time.sleep(1.0)
                    seen = listening([q for q in self.ranks() if q != p.pid])
                    break
                time.sleep(0.2)
            print("listening:", seen)
            self.assertGreaterEqual(len(seen), 2, "the run's ranks never listened")
            self.assertEqual([s for s in seen if s[0] not in ("127.0.0.1", "::1")], [])
        finally:
            p.terminate()
            p.communicate(timeout=30)

    def test_torchrun_style_ranks_on_loopback_still_train(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        procs = []
        for rank in (0, 1):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            procs.append(subprocess.Popen([ENGINE, "worker", "--model", self.model, "--plan", self.plan,
                                           "--steps", "2", "--timeout-s", "30",
                                           "--out", os.path.join(self.tmp.name, f"rank{rank}.json")],
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
        for rank, proc in enumerate(procs):
            out, err = proc.communicate(timeout=120)
            self.assertEqual(proc.returncode, 0, f"rank {rank}: {err}")
        with open(os.path.join(self.tmp.name, "rank0.json")) as f:
            self.assertTrue(json.load(f))


if __name__ == "__main__":
    unittest.main(verbosity=2)
