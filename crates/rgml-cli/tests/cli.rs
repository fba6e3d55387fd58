//! The command-line contract: device listing, op conformance output, errors for bad names.

use std::process::Command;

fn rgml(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_rgml"))
        .args(args)
        .output()
        .expect("run rgml");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn devices_json_lists_the_cpu() {
    let (code, stdout, _) = rgml(&["devices", "--json"]);
    assert_eq!(code, 0);
    let list: serde_json::Value = serde_json::from_str(&stdout).expect("valid JSON");
    let names: Vec<&str> = list
        .as_array()
        .expect("a JSON list")
        .iter()
        .filter_map(|d| d["name"].as_str())
        .collect();
    assert!(names.contains(&"CPU"), "{names:?}");
}

#[test]
fn test_ops_ends_with_the_summary_line() {
    let (code, stdout, stderr) = rgml(&["test-ops", "-b", "CPU", "-o", "ADD"]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let last = stdout.lines().last().unwrap_or_default();
    let (passed, failed) = last
        .split_once(" passed, ")
        .expect("summary line 'N passed, M failed'");
    assert!(
        passed.trim().parse::<usize>().expect("a count") > 0,
        "{last}"
    );
    assert_eq!(failed, "0 failed");
}

#[test]
fn unknown_names_are_errors_not_panics() {
    let (code, _, stderr) = rgml(&["test-ops", "-b", "NoSuchDevice"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("NoSuchDevice"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let (code, _, stderr) = rgml(&["test-ops", "-b", "CPU", "-o", "NOT_AN_OP"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("NOT_AN_OP"), "{stderr}");
}
