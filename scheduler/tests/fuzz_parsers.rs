//! Property tests of the parsers users feed by hand: profiles (TOML) and nccl-tests outputs (text
//! and JSON). Whatever the input, a parser returns a value or an error naming its origin — never a
//! panic — and garbage is never accepted.

use proptest::prelude::*;
use shardplan_scheduler::nccl_tests::parse;
use shardplan_scheduler::profile::Profile;
use shardplan_scheduler::timeline::Collective;

const PROFILE: &str = include_str!("../../profiles/llama2-7b-h100-n64.toml");
const NCCL_TEXT: &str =
    include_str!("../../tests/fixtures/nccl-tests/reduce-scatter-size0-8ranks.txt");
const NCCL_JSON: &str = include_str!("../../tests/fixtures/nccl-tests/json-output.json");

/// Values a hand edit or a broken tool might leave where a number or word stood.
fn replacement() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("-1".to_string()),
        Just("1e308".to_string()),
        Just("nan".to_string()),
        Just("inf".to_string()),
        Just("-0".to_string()),
        Just("9223372036854775807".to_string()),
        Just("18446744073709551616".to_string()),
        Just("0".to_string()),
        Just("\"x\"".to_string()),
        Just("[".to_string()),
        Just("N/A".to_string()),
        any::<i64>().prop_map(|v| v.to_string()),
        any::<f64>().prop_map(|v| v.to_string()),
        "[ -~]{0,12}",
    ]
}

/// `text` with its `k`-th whitespace-separated token (modulo the count) replaced.
fn replace_token(text: &str, k: usize, with: &str) -> String {
    let tokens: Vec<(usize, &str)> = text
        .split_whitespace()
        .map(|t| (t.as_ptr() as usize - text.as_ptr() as usize, t))
        .collect();
    let (start, token) = tokens[k % tokens.len()];
    format!("{}{with}{}", &text[..start], &text[start + token.len()..])
}

/// `text` cut after `k` bytes (modulo its length, on a character boundary).
fn truncate(text: &str, k: usize) -> &str {
    let mut end = k % (text.len() + 1);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn profiles_with_one_token_replaced_parse_or_fail_cleanly(k in any::<usize>(), with in replacement()) {
        let edited = replace_token(PROFILE, k, &with);
        match Profile::from_toml(&edited, "fuzz.toml") {
            Ok(profile) => prop_assert!(profile.validate("fuzz.toml").is_ok()),
            Err(e) => {
                let message = e.to_string();
                prop_assert!(message.starts_with("fuzz.toml"), "{}", message);
                prop_assert!(!message.contains('\n'), "{}", message);
            }
        }
    }

    #[test]
    fn truncated_profiles_never_panic(k in any::<usize>()) {
        let cut = truncate(PROFILE, k);
        if let Err(e) = Profile::from_toml(cut, "cut.toml") {
            prop_assert!(e.to_string().starts_with("cut.toml"));
        }
    }

    #[test]
    fn garbage_is_never_a_profile(text in "[ -~\n]{0,400}") {
        prop_assert!(Profile::from_toml(&text, "garbage.toml").is_err());
    }

    #[test]
    fn nccl_outputs_with_one_token_replaced_parse_or_fail_cleanly(
        k in any::<usize>(),
        with in replacement(),
        json in any::<bool>(),
        op in 0usize..3,
    ) {
        let edited = replace_token(if json { NCCL_JSON } else { NCCL_TEXT }, k, &with);
        match parse(&edited, "fuzz.txt", Collective::ALL[op]) {
            Ok(imported) => prop_assert!(imported.curve.check().is_ok()),
            Err(e) => prop_assert!(e.to_string().starts_with("fuzz.txt"), "{}", e),
        }
    }

    #[test]
    fn garbage_is_never_an_nccl_tests_output(text in "[ -~\n]{0,400}", op in 0usize..3) {
        prop_assert!(parse(&text, "garbage.txt", Collective::ALL[op]).is_err());
    }
}
