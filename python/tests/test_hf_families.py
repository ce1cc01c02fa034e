"""Every dense decoder family `shardplan profile analytic --model config.json` reads, tiny and at
its real size, counts exactly transformers' `num_parameters()` (DESIGN §7.1), unit by unit as
`shardplan_torch.units` maps the tiny models (every parameter in one unit, a tied head reading
the embedding); mixtures of experts are refused naming their experts, and a config error names
the config's own field."""

import json
import pathlib
import subprocess
import tempfile
import tomllib
import unittest

import hf_families
import shardplan_torch
import torch
from shardplan_torch import units
from shardplan_torch.testing import BIN


def analytic(config, d, *extra):
    """`profile analytic --json` of `config` saved under `d`: (exit code, JSON or stderr)."""
    config.save_pretrained(d)
    out = subprocess.run([BIN, "profile", "analytic", "--model", f"{d}/config.json", "--device",
                          "h100-sxm", "--world-size", "64", "--gpus-per-node", "8", "--out",
                          f"{d}/p.toml", "--json", *extra], capture_output=True, text=True)
    return out.returncode, json.loads(out.stdout) if out.returncode == 0 else out.stdout + out.stderr


class Families(unittest.TestCase):
    def test_tiny_configs_count_transformers_parameters(self):
        for tag, _, _ in hf_families.TINY_VARIANTS:
            with self.subTest(tag), tempfile.TemporaryDirectory() as d:
                import transformers as hf
                config = hf_families.tiny(tag)
                code, out = analytic(config, d)
                self.assertEqual(code, 0, out)
                model = hf.AutoModelForCausalLM.from_config(config)
                self.assertEqual(out["total_params"], model.num_parameters(), tag)
                self.assertEqual(out["seq_len"], 64, "the config's length without --seq-len")
                with open(f"{d}/p.toml", "rb") as f:
                    profiled = tomllib.load(f)["units"]
                mapped = units(model)
                self.assertEqual([(u["name"], u["params"]) for u in profiled],
                                 [(u.name, sum(p.numel() for p in u.parameters())) for u in mapped])
                tied = config.tie_word_embeddings
                self.assertEqual(profiled[-1].get("reads_params_of"), "embedding" if tied else None)
                self.assertEqual(mapped[-1].reads_params_of, "embedding" if tied else None)

    def test_the_pytorch_profiler_keeps_what_the_comm_profile_says_of_the_run(self):
        """K, bytes per parameter and the node layout of `profile analytic` reach the measured
        profile unless given, and `shardplan` reads that profile back."""
        import transformers as hf
        with tempfile.TemporaryDirectory() as d:
            config = hf_families.tiny("qwen2")
            code, out = analytic(config, d, "--micro-batches", "2")
            self.assertEqual(code, 0, out)
            model = hf.AutoModelForCausalLM.from_config(config)
            batch = torch.randint(0, 256, (1, 17))

            def loss_fn(m, b):
                return m(input_ids=b[:, :-1], labels=b[:, :-1], use_cache=False).loss

            for given, expected in [({}, (2, [2, 2, 12])),
                                    (dict(micro_batches=1, bytes_per_param=(4, 4, 8)), (1, [4, 4, 8]))]:
                with self.subTest(given=given):
                    out = f"{d}/measured.toml"
                    shardplan_torch.profile(model, units(model), batch, loss_fn, f"{d}/p.toml", out,
                                            warmup=0, repeats=1, **given)
                    with open(out, "rb") as f:
                        measured = tomllib.load(f)
                    bytes_per_param = measured["bytes_per_param"]
                    self.assertEqual((measured.get("micro_batches", 1),
                                      [bytes_per_param[k] for k in ["param", "grad", "optimizer"]]),
                                     expected)
                    self.assertEqual(measured["topology"]["gpus_per_node"], 8)
                    kind = "fsdp2-nosync" if expected[0] == 2 else "fsdp2"
                    fsdp2 = subprocess.run([BIN, "baseline", "--profile", out, "--kind", kind,
                                            "--out", f"{d}/b.toml"], capture_output=True, text=True)
                    self.assertEqual(fsdp2.returncode, 0, fsdp2.stdout + fsdp2.stderr)

    def test_real_sizes_count_transformers_parameters(self):
        for name, _ in hf_families.REAL:
            with self.subTest(name), tempfile.TemporaryDirectory() as d:
                config = hf_families.real(name)
                seq_len = 1024 if name.startswith("GPT-2") else 4096
                code, out = analytic(config, d, "--seq-len", str(seq_len))
                self.assertEqual(code, 0, out)
                self.assertEqual(out["total_params"], hf_families.parameters(config), name)
                self.assertEqual((out["seq_len"], out["gpus_per_node"]), (seq_len, 8))

    def test_mixtures_of_experts_are_refused_naming_the_experts(self):
        import transformers as hf
        for config, field in [
            (hf.MixtralConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                              num_attention_heads=4, num_key_value_heads=2), "num_local_experts"),
            (hf.Qwen2MoeConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                               num_attention_heads=4, num_key_value_heads=2), "num_experts"),
        ]:
            with self.subTest(field), tempfile.TemporaryDirectory() as d:
                code, err = analytic(config, d)
                self.assertEqual(code, 2, err)
                self.assertIn(field, err)
                self.assertIn("experts", err)
                self.assertIn("config.json", err)

    def test_config_errors_name_the_configs_own_field(self):
        import transformers as hf
        for config, expected in [
            (hf.GPT2Config(n_embd=128, n_head=3, n_layer=2), "n_head`: expected a divisor of n_embd = 128"),
            (hf.GPT2Config(n_embd=128, n_head=4, n_layer=10**6), "n_layer"),
            (hf.LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=3,
                            num_hidden_layers=1), "num_key_value_heads"),
        ]:
            with self.subTest(expected), tempfile.TemporaryDirectory() as d:
                code, err = analytic(config, d)
                self.assertEqual(code, 2, err)
                self.assertIn(expected, err)
                self.assertIn(str(pathlib.Path(d) / "config.json"), err)


if __name__ == "__main__":
    unittest.main()
