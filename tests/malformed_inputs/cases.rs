//! The table of malformed inputs `malformed_inputs.rs` runs: one [`Case`] per input.

use super::{Inputs, fixture, words};
use std::path::Path;

/// One case: the command line, the exit code, a fragment of the message, the JSON `field`.
pub struct Case {
    pub name: &'static str,
    pub args: Vec<String>,
    pub code: i32,
    pub fragment: &'static str,
    pub field: Option<&'static str>,
}

fn case(
    name: &'static str,
    line: String,
    code: i32,
    fragment: &'static str,
    field: Option<&'static str>,
) -> Case {
    Case {
        name,
        args: words(&line),
        code,
        fragment,
        field,
    }
}

/// Every case, its inputs written under `inputs`' folder.
pub fn cases(inputs: &Inputs) -> Vec<Case> {
    let profile = &inputs.profile;
    let plan = &inputs.plan;
    let out = inputs.path("out.toml").display().to_string();
    let baseline = |p: &str| format!("baseline --profile {p} --kind ddp --out {out}");
    let garbage = inputs.write("garbage.bin", &[0xff, 0xfe, 0x00, 0x80, 0x41]);
    let empty = inputs.write("empty.toml", b"");
    let huge_model = inputs.write(
        "huge.toml",
        std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("models/gpt2-small.toml"),
        )
        .unwrap()
        .replacen("hidden = 768", "hidden = 1099511627776", 1)
        .as_bytes(),
    );
    let negative_size = inputs.write(
        "negative.txt",
        std::fs::read_to_string(fixture("all-reduce-8ranks.txt"))
            .unwrap()
            .replacen("       32768 ", "      -32768 ", 1)
            .as_bytes(),
    );
    let over_cap = {
        let text = std::fs::read_to_string(plan).unwrap();
        let capped = format!("memory_cap_bytes = 1048576\n{text}");
        inputs.write("over-cap.toml", capped.as_bytes())
    };
    let other_micro_batches = {
        let text = std::fs::read_to_string(plan).unwrap();
        inputs.write(
            "other-k.toml",
            format!("micro_batches = 4\n{text}").as_bytes(),
        )
    };
    let tiny_in_four = inputs.write(
        "tiny-k4.toml",
        std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("models/gpt2-tiny.toml"),
        )
        .unwrap()
        .replacen("[training]", "[training]\nmicro_batches = 4", 1)
        .as_bytes(),
    );
    let tiny_with = |name: &str, edit: &dyn Fn(String) -> String| {
        let tiny = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/gpt2-tiny.toml");
        inputs.write(
            name,
            edit(std::fs::read_to_string(tiny).unwrap()).as_bytes(),
        )
    };
    let bf16_reductions_of_fp32 = tiny_with("reduce-bf16.toml", &|text| {
        text.replacen("[training]", "[training]\nreduce = \"bf16\"", 1)
    });
    let bf16_odd_ffn = tiny_with("odd-ffn.toml", &|text| {
        text.replacen("[training]", "[training]\nprecision = \"bf16\"", 1)
            .replacen("ffn = 512", "ffn = 511", 1)
    });
    let accumulating = inputs.profile_with("world_size = ", "micro_batches = 4\nworld_size = ", 1);
    let three_per_node = {
        let text = std::fs::read_to_string(profile).unwrap();
        inputs.write(
            "nodes-of-3.toml",
            format!("{text}\n[topology]\ngpus_per_node = 3\n").as_bytes(),
        )
    };
    let other_profile = {
        let text = std::fs::read_to_string(profile).unwrap();
        inputs.write(
            "other.toml",
            text.replacen("iteration_extra_us = ", "iteration_extra_us = 1", 1)
                .as_bytes(),
        )
    };
    // DESIGN §3.13: a profile without its host, one whose host lacks a curve, and a plan that
    // offloads its first unit (matched by world size and names).
    let profile_text = std::fs::read_to_string(profile).unwrap();
    let (before_host, _) = profile_text.split_once("\n[host]").unwrap();
    let no_host = inputs.write("no-host.toml", before_host.as_bytes());
    let (before_d2h, _) = profile_text.split_once("\n[host.device_to_host]").unwrap();
    let no_d2h = inputs.write("no-d2h.toml", before_d2h.as_bytes());
    let offloading = {
        let text = std::fs::read_to_string(plan).unwrap();
        let kept: Vec<&str> = text
            .lines()
            .filter(|l| !l.starts_with("profile_digest"))
            .collect();
        let text =
            kept.join("\n")
                .replacen("level = \"sdp\"", "level = \"sdp\"\noffload = \"full\"", 1);
        inputs.write("offloading.toml", text.as_bytes())
    };
    let offload_baseline =
        |p: &str| format!("baseline --profile {p} --kind fsdp2-offload --out {out}");
    vec![
        case(
            "a host without memory",
            baseline(&inputs.profile_with("memory_bytes = 2199023255552", "memory_bytes = 0", 1)),
            2,
            "a positive byte count, got 0",
            Some("host.memory_bytes"),
        ),
        case(
            "a negative host step",
            baseline(&inputs.profile_with(
                "optimizer_us_per_param = 0.002",
                "optimizer_us_per_param = -0.002",
                1,
            )),
            2,
            "a positive time up to 1e15 µs, got -0.002",
            Some("host.optimizer_us_per_param"),
        ),
        case(
            "a host without its device-to-host curve",
            baseline(&no_d2h),
            2,
            "field `host.device_to_host`: missing",
            Some("host.device_to_host"),
        ),
        case(
            "a plan that offloads on a profile without a host",
            format!("simulate --profile {no_host} --plan {offloading}"),
            2,
            "none: the profile has no [host]",
            Some("units[0].offload"),
        ),
        case(
            "a cap below what offload fits",
            format!("solve --profile {profile} --memory-cap 300MiB --out {out}"),
            3,
            "no plan fits the memory cap of 300.00 MiB, offload to the host included: the \
             smallest feasible cap is 591.48 MiB (620215168 bytes) with offload (the offload ILP \
             within window depth 4 and the offload baselines)",
            None,
        ),
        case(
            "an offload baseline on a profile without a host",
            offload_baseline(&no_host),
            2,
            "fsdp2-offload needs a profile with a host link",
            Some("--kind"),
        ),
        case(
            "a host smaller than the offloaded state",
            offload_baseline(&inputs.profile_with(
                "memory_bytes = 2199023255552",
                "memory_bytes = 1048576",
                1,
            )),
            3,
            "over the host's memory of 1.00 MiB (the profile's host.memory_bytes)",
            None,
        ),
        case(
            "missing file",
            baseline("missing.toml"),
            2,
            "missing.toml: cannot read: No such file",
            None,
        ),
        case("not UTF-8", baseline(&garbage), 2, "cannot read", None),
        case(
            "empty file",
            baseline(&empty),
            2,
            "field `schema`: missing",
            Some("schema"),
        ),
        case(
            "negative time",
            baseline(&inputs.profile_with("forward_us = ", "forward_us = -", 2)),
            2,
            "expected a time of 0 to 1e15 µs",
            Some("units[1].forward_us"),
        ),
        case(
            "time that sums to infinity",
            baseline(&inputs.profile_with("backward_us = ", "backward_us = 1e308 #", 3)),
            2,
            "got 1e308",
            Some("units[0].backward_us"),
        ),
        case(
            "negative factor of one collective",
            baseline(&inputs.profile_with(
                "overlap_slowdown = ",
                "overlap_slowdown_all_gather = -0.25\noverlap_slowdown = ",
                1,
            )),
            2,
            "a finite number >= 0, got -0.25",
            Some("overlap_slowdown_all_gather"),
        ),
        case(
            "negative recompute time",
            baseline(&inputs.profile_with(
                "forward_us = ",
                "recompute_us = -0.5\nforward_us = ",
                2,
            )),
            2,
            "expected a time of 0 to 1e15 µs for unit `embedding`, got -0.5",
            Some("units[0].recompute_us"),
        ),
        case(
            "bytes at the largest TOML integer",
            baseline(&inputs.profile_with(
                "activation_bytes = ",
                "activation_bytes = 9223372036854775807 #",
                1,
            )),
            2,
            "at most 1125899906842624 bytes (1 PiB) for unit `embedding`, got 9223372036854775807",
            Some("units[0].activation_bytes"),
        ),
        case(
            "a unit reading the parameters of no earlier unit",
            baseline(&inputs.profile_with(
                "forward_us = ",
                "reads_params_of = \"head\"\nforward_us = ",
                1,
            )),
            2,
            "the name of an earlier unit that no other unit reads, got `head`",
            Some("units[0].reads_params_of"),
        ),
        case(
            "negative integer",
            baseline(&inputs.profile_with("activation_bytes = ", "activation_bytes = -", 1)),
            2,
            "expected u64",
            Some("units[0].activation_bytes"),
        ),
        case(
            "fractional integer",
            baseline(&inputs.profile_with("world_size = 8", "world_size = 8.5", 1)),
            2,
            "expected u32",
            Some("world_size"),
        ),
        case(
            "shard quantum of zero",
            baseline(&inputs.profile_with(
                "world_size = 8",
                "world_size = 8\nshard_quantum_params = 0",
                1,
            )),
            2,
            "an integer in 1..=1048576, got 0",
            Some("shard_quantum_params"),
        ),
        case(
            "unknown field",
            baseline(&inputs.profile_with("params = ", "parameters = ", 1)),
            2,
            "parameters",
            None,
        ),
        case(
            "other schema",
            baseline(&inputs.profile_with("schema = 1", "schema = 2", 1)),
            2,
            "expected 1, got 2",
            Some("schema"),
        ),
        case(
            "output is the input",
            format!("baseline --profile {profile} --kind ddp --out {profile}"),
            2,
            "it would be overwritten",
            Some("--out"),
        ),
        case(
            "output resolves to the input",
            format!(
                "solve --profile {profile} --memory-cap 80GiB --out {}/../{}/profile.toml",
                inputs.dir.path().display(),
                inputs.dir.path().file_name().unwrap().to_string_lossy()
            ),
            2,
            "it would be overwritten",
            Some("--out"),
        ),
        case(
            "empty caps",
            format!("sweep --profile {profile} --caps '' --out-dir {out}"),
            2,
            "--caps",
            Some("--caps"),
        ),
        case(
            "unknown method",
            format!("sweep --profile {profile} --methods ddp,zero9 --out-dir {out}"),
            2,
            "zero9",
            Some("--methods"),
        ),
        case(
            "gap out of range",
            format!("solve --profile {profile} --memory-cap 80GiB --gap 2 --out {out}"),
            2,
            "a relative gap in [0, 1)",
            Some("--gap"),
        ),
        case(
            "time limit not finite",
            format!("solve --profile {profile} --memory-cap 80GiB --time-limit inf --out {out}"),
            2,
            "a positive number of seconds",
            Some("--time-limit"),
        ),
        case(
            "zero cap",
            format!("baseline --profile {profile} --kind ddp --memory-cap 0GiB --out {out}"),
            2,
            "--memory-cap",
            Some("--memory-cap"),
        ),
        case(
            "cap missing for the time objective",
            format!("solve --profile {profile} --out {out}"),
            2,
            "--memory-cap",
            Some("--memory-cap"),
        ),
        case(
            "plan for another profile",
            format!("simulate --profile {other_profile} --plan {plan}"),
            2,
            "made for profile sha256:",
            None,
        ),
        case(
            "export of a plan above its own cap",
            format!("export fsdp2 --profile {profile} --plan {over_cap} --out {out}"),
            3,
            "above its own memory_cap_bytes",
            None,
        ),
        case(
            "all_reduce output as the all_gather curve",
            format!(
                "comm import --all-gather {} --into {profile} --out {out}",
                fixture("all-reduce-8ranks.txt")
            ),
            2,
            "got `sum`",
            Some("redop"),
        ),
        case(
            "all_gather output as the reduce_scatter curve",
            format!(
                "comm import --reduce-scatter {} --into {profile} --out {out}",
                fixture("current-layout-no-hash.txt")
            ),
            2,
            "got `none`",
            Some("redop"),
        ),
        case(
            "negative size in nccl-tests",
            format!("comm import --all-reduce {negative_size} --into {profile} --out {out}"),
            2,
            "got `-32768`",
            Some("size"),
        ),
        case(
            "model too large for the arithmetic",
            format!(
                "profile analytic --model {huge_model} --device h100-sxm --world-size 8 --out {out}"
            ),
            2,
            "an integer in 1..=1048576, got 1099511627776",
            Some("hidden"),
        ),
        case(
            "unknown device",
            format!(
                "profile analytic --model models/gpt2-small.toml --device tpu-v9 --world-size 8 --out {out}"
            ),
            2,
            "h100-sxm",
            None,
        ),
        case(
            "missing required argument",
            format!("solve --profile {profile} --memory-cap 80GiB"),
            2,
            "--out <OUT>",
            Some("--out"),
        ),
        case(
            "tf32 on the cpu",
            format!(
                "run --backend cpu --tf32 --profile {profile} --plan {plan} --model models/mlp-small.toml --steps 1"
            ),
            2,
            "--backend cuda: the CPU backend's products are fp32",
            Some("--tf32"),
        ),
        case(
            "cuda graphs on the cpu",
            format!(
                "profile measure --backend cpu --cuda-graphs --model models/gpt2-tiny.toml --world-size 1 --out {out}"
            ),
            2,
            "--backend cuda: the CPU backend's operations are host calls",
            Some("--cuda-graphs"),
        ),
        case(
            "launch times on the cpu",
            format!(
                "profile measure --backend cpu --launch-times --model models/gpt2-tiny.toml --world-size 1 --out {out}"
            ),
            2,
            "--backend cuda (the CPU backend's kernels are calls on the host",
            Some("--launch-times"),
        ),
        case(
            "a zoo transformer measured on the cpu",
            format!(
                "profile measure --backend cpu --model models/llama2-7b.toml --world-size 8 --out {out}"
            ),
            2,
            "a [training] table: on the CPU a transformer is measured by training it",
            Some("training"),
        ),
        case(
            "launch times of a replayed transformer",
            format!(
                "profile measure --backend cpu --launch-times --model models/llama2-7b.toml --world-size 8 --out {out}"
            ),
            2,
            "a [training] table for --launch-times",
            Some("training"),
        ),
        case(
            "no micro-batches in a profile",
            baseline(&inputs.profile_with("world_size = ", "micro_batches = 0\nworld_size = ", 1)),
            2,
            "an integer in 1..=65536, got 0",
            Some("micro_batches"),
        ),
        case(
            "a node size that does not divide the world",
            baseline(&three_per_node),
            2,
            "a positive divisor of world_size 8, got 3",
            Some("topology.gpus_per_node"),
        ),
        case(
            "an analytic node size that does not divide the world",
            format!(
                "profile analytic --model models/gpt2-tiny.toml --device h100-sxm --world-size 8 --gpus-per-node 3 --out {out}"
            ),
            2,
            "a positive divisor of the world size 8, got 3",
            Some("gpus_per_node"),
        ),
        case(
            "a plan for another number of micro-batches",
            format!("simulate --profile {profile} --plan {other_micro_batches}"),
            2,
            "made for another number of micro-batches",
            Some("micro_batches"),
        ),
        case(
            "a model file's micro-batches against the profile's",
            format!(
                "run --backend cpu --profile {profile} --plan {plan} --model {tiny_in_four} --data README.md --steps 1"
            ),
            2,
            "expected 1 (the micro-batches per step of profile",
            Some("training.micro_batches"),
        ),
        case(
            "a model file's precision against the profile's bytes per parameter",
            format!(
                "run --backend cpu --profile {profile} --plan {plan} --model models/gpt2-tiny.toml --data README.md --steps 1"
            ),
            2,
            "expected precision = \"bf16\", reduce = \"bf16\" (profile",
            Some("training.precision"),
        ),
        case(
            "bf16 reductions of fp32 parameters",
            format!(
                "profile measure --backend cpu --model {bf16_reductions_of_fp32} --world-size 1 --out {out}"
            ),
            2,
            "bf16 reductions need precision = \"bf16\"",
            Some("training.reduce"),
        ),
        case(
            "an odd tensor size under bf16",
            format!(
                "profile measure --backend cpu --model {bf16_odd_ffn} --world-size 1 --out {out}"
            ),
            2,
            "field `ffn`: expected an even size under `training.precision = \"bf16\"`",
            Some("ffn"),
        ),
        case(
            "no-sync without micro-batches",
            format!("baseline --profile {profile} --kind fsdp2-nosync --out {out}"),
            2,
            "gradient sync can only be skipped between micro-batches",
            None,
        ),
        case(
            "an impossible cap with micro-batches",
            format!("solve --profile {accumulating} --memory-cap 1MiB --out {out}"),
            3,
            "no plan of 4 micro-batches fits the memory cap of 1.00 MiB: the smallest feasible cap is",
            None,
        ),
        case(
            "unknown flag",
            format!("{} --frobnicate", baseline(profile)),
            2,
            "--frobnicate",
            Some("--frobnicate"),
        ),
    ]
}
