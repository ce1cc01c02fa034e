"""An offloading plan exported to FSDP2 (DESIGN §3.13) and applied to a tiny transformers GPT-2
(tied embeddings) at N = 2 under gloo: the `fsdp2-offload` and `zero3-offload` baselines of the
analytic profile (H100 SXM, whose catalog entry has a host link; bf16 bytes, so FSDP2's bf16
policy) and a plan offloading one unit's optimizer only. Every offloaded unit's `fully_shard`
holds FSDP2's `CPUOffloadPolicy` (unpinned: pinned memory needs a GPU), the others none; each
trains to unsharded transformers' losses within 1% (bf16, DESIGN §6.9); the export lists the
`optimizer` unit it exports as full offload and the overlapped steps it exports after the
backward, and reports the FSDP2 time, peak and host memory."""

import json
import pathlib
import tempfile
import unittest

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from shardplan_torch import apply_plan, units
from shardplan_torch.testing import free_port, in_process_group, shardplan

VOCAB, SEQ, BATCH, STEPS = 1024, 16, 2, 2


def make_model():
    import transformers as hf
    torch.manual_seed(0)
    config = hf.GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=4,
                           resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
                           eos_token_id=0)
    return hf.GPT2LMHeadModel(config).float(), config


def tokens(rank, world):
    g = torch.Generator().manual_seed(1234)
    every = torch.randint(0, VOCAB, (BATCH * world, SEQ + 1), generator=g)
    return every[rank * BATCH:(rank + 1) * BATCH]


def train(model, batch):
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(STEPS):
        logits = model(input_ids=batch[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss)
    return losses


def exported_runs(rank, world, plans):
    results = {}
    for tag, path in plans.items():
        plan = json.loads(pathlib.Path(path).read_text())
        model, _ = make_model()
        model_units = units(model)
        apply_plan(model, model_units, plan)
        offloaded = {}
        for u in model_units:
            params = u.modules[0]._get_fsdp_state()._fsdp_param_group.fsdp_params
            offloaded[u.name] = [p.offload_to_cpu for p in params]
        losses = []
        for loss in train(model, tokens(rank, world)):
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            losses.append(mean.item() / world)
        results[tag] = {"losses": losses, "offloaded": offloaded}
    return results


def worker(rank, world, plans, result_path, port):
    results = in_process_group(rank, world, port, exported_runs, rank, world, plans)
    if rank == 0:
        pathlib.Path(result_path).write_text(json.dumps(results))


class OffloadExport(unittest.TestCase):
    def test_offloading_plans_apply_and_train(self):
        with tempfile.TemporaryDirectory() as d:
            d = pathlib.Path(d)
            _, config = make_model()
            config.save_pretrained(d / "hf")
            profile = d / "p.toml"
            shardplan("profile", "analytic", "--model", str(d / "hf" / "config.json"), "--device",
                      "h100-sxm", "--world-size", "2", "--block-size", "16KiB", "--out", str(profile))
            plans = {}
            for kind in ["fsdp2-offload", "zero3-offload"]:
                plans[kind] = d / f"{kind}.plan.toml"
                shardplan("baseline", "--profile", str(profile), "--kind", kind, "--out", str(plans[kind]))
            # fsdp2 with its second unit's optimizer offloaded, stepping overlapped (the default).
            text = (d / "fsdp2.plan.toml")
            shardplan("baseline", "--profile", str(profile), "--kind", "fsdp2", "--out", str(text))
            lines = text.read_text().split("\n")
            levels = [k for k, line in enumerate(lines) if line.startswith("level = ")]
            lines.insert(levels[1] + 1, 'offload = "optimizer"')
            lines = [line for line in lines if not line.startswith("profile_digest")]
            plans["one-optimizer"] = d / "one-optimizer.plan.toml"
            plans["one-optimizer"].write_text("\n".join(lines))
            exported = {}
            for tag, plan in plans.items():
                path = d / f"{tag}.fsdp2.json"
                shardplan("export", "fsdp2", "--plan", str(plan), "--profile", str(profile),
                          "--out", str(path), "--force")
                exported[tag] = str(path)
            result = d / "results.json"
            mp.spawn(worker, args=(2, exported, str(result), free_port()), nprocs=2)
            results = json.loads(result.read_text())
            reference, _ = make_model()
            expected = [loss.item() for loss in train(reference, torch.cat([tokens(0, 2), tokens(1, 2)]))]
            for tag, path in exported.items():
                plan = json.loads(pathlib.Path(path).read_text())
                got = results[tag]
                for ours, theirs in zip(got["losses"], expected, strict=True):
                    self.assertLess(abs(ours - theirs) / abs(theirs), 1e-2, f"{tag}: {got['losses']} vs {expected}")
                for u in plan["units"]:
                    policy = u.get("offload_policy")
                    self.assertEqual(set(got["offloaded"][u["name"]]), {policy is not None}, f"{tag} {u['name']}")
                    if policy is not None:
                        self.assertEqual(policy, {"pin_memory": True})
                self.assertGreater(plan["fsdp2_host_memory_bytes"], 0, tag)
                self.assertGreater(plan["fsdp2_iteration_time_us"], 0, tag)
            one = json.loads(pathlib.Path(exported["one-optimizer"]).read_text())
            offloaded = [u["name"] for u in one["units"] if "offload_policy" in u]
            self.assertEqual(offloaded, [one["units"][1]["name"]])
            notes = " ".join(one["approximations"])
            self.assertIn("offload = optimizer", notes)
            self.assertIn("host_step = overlapped", notes)
            self.assertFalse(one["exact"])


if __name__ == "__main__":
    unittest.main()
