//! The environment variables the `rgml` command line maps onto backend options: good values
//! take effect, bad ones are errors that name the variable and what it accepts (exit status 2),
//! never silently ignored or capped.

use std::process::{Command, Output};

const VARS: [&str; 4] = [
    "RGML_CPU_ISA",
    "RGML_CPU_REPACK",
    "RGML_CPU_DEVICES",
    "RGML_WGPU_SOFT_FMA",
];

/// `rgml devices --json` with only `var=value` of the variables set.
fn devices(var: &str, value: &str) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rgml"));
    cmd.args(["devices", "--json"]);
    for v in VARS {
        cmd.env_remove(v);
    }
    cmd.env(var, value).output().expect("run rgml")
}

#[test]
fn bad_values_are_errors_naming_the_variable() {
    for (var, value, accepted) in [
        ("RGML_CPU_ISA", "bogus", "avx2, avx512, avx512-nobf16"),
        ("RGML_CPU_REPACK", "bogus", "0 or 1"),
        ("RGML_CPU_DEVICES", "abc", "from 0 to 64"),
        ("RGML_CPU_DEVICES", "65", "from 0 to 64"),
        ("RGML_CPU_DEVICES", "100000", "from 0 to 64"),
        ("RGML_WGPU_SOFT_FMA", "on", "0 or 1"),
    ] {
        let out = devices(var, value);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{var}={value}: {stderr}");
        assert!(
            stderr.contains(&format!("{var}={value}")) && stderr.contains(accepted),
            "{var}={value}: {stderr}"
        );
        assert!(out.stdout.is_empty(), "{var}={value}: nothing runs");
    }
}

#[test]
fn good_values_take_effect() {
    let names = |out: &Output| -> Vec<String> {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON output");
        list.as_array()
            .expect("a list")
            .iter()
            .filter_map(|d| d["name"].as_str().map(str::to_string))
            .filter(|n| n.starts_with("CPU"))
            .collect()
    };
    assert_eq!(
        names(&devices("RGML_CPU_DEVICES", "2")),
        ["CPU", "CPU0", "CPU1"]
    );
    assert_eq!(names(&devices("RGML_CPU_DEVICES", "")), ["CPU"]);
    for (var, value) in [
        ("RGML_CPU_ISA", "avx512"),
        ("RGML_CPU_ISA", "avx512-nobf16"),
        ("RGML_CPU_REPACK", "0"),
        ("RGML_WGPU_SOFT_FMA", "1"),
    ] {
        assert_eq!(names(&devices(var, value)), ["CPU"], "{var}={value}");
    }
}
