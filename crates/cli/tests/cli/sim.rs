//! `xfer sim`: a controller on a simulated path, its JSON trace and its errors.

use crate::common::xfer;

/// Runs `xfer sim ARGS`, requires success, returns stdout.
fn sim_ok(args: &[&std::ffi::OsStr]) -> Vec<u8> {
    let out = xfer().arg("sim").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn os(args: &[&'static str]) -> Vec<&'static std::ffi::OsStr> {
    args.iter().map(|a| std::ffi::OsStr::new(*a)).collect()
}

fn json_lines(stdout: &[u8]) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

#[test]
fn gd_on_the_paper_scenario_prints_a_trace_and_a_summary() {
    let stdout = sim_ok(&os(&[
        "--scenario",
        "paper-fig2",
        "--optimizer",
        "gd",
        "--duration",
        "60s",
        "--seed",
        "3",
        "--json",
    ]));
    let lines = json_lines(&stdout);
    assert_eq!(lines.len(), 61, "60 intervals and a summary");
    for (i, mi) in lines[..60].iter().enumerate() {
        assert_eq!(mi["type"], "mi");
        assert_eq!(mi["mi"], i as u64);
        for key in [
            "streams",
            "connecting",
            "retiring",
            "retiring_throughput",
            "throughput",
            "loss",
            "rtt",
            "rtt_ratio",
            "rtt_gradient",
        ] {
            assert!(mi[key].is_number(), "{key} in {mi}");
        }
        for key in [
            "utility",
            "reward",
            "decision",
            "oracle_streams",
            "utility_fraction",
            "capacity_mbps",
            "base_rtt_ms",
            "random_loss",
            "background_flows",
        ] {
            assert!(mi[key].is_number(), "{key} in {mi}");
        }
    }
    let summary = &lines[60];
    assert_eq!(summary["type"], "summary");
    assert_eq!(summary["controller"], "gd");
    let last = summary["final_streams"].as_u64().unwrap();
    assert!((18..=22).contains(&last), "{summary}");
    let again = sim_ok(&os(&[
        "--scenario",
        "paper-fig2",
        "--duration",
        "60s",
        "--seed",
        "3",
        "--json",
        "--optimizer",
        "gd",
    ]));
    assert_eq!(again, stdout, "same seed, same run");
}

/// A scenario file in a fresh directory with this capacity (the directory lives as long as the
/// returned guard).
fn scenario_file(name: &str, capacity_mbps: u32) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("{name}.toml"));
    let text = format!(
        "name = \"{name}\"\ncapacity_mbps = {capacity_mbps}\nbase_rtt_ms = 10\nbuffer_kib = 256\n"
    );
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

#[test]
fn a_scenario_file_can_be_given() {
    let (_dir, path) = scenario_file("mine", 100);
    let mut args = os(&["--scenario"]);
    args.push(path.as_os_str());
    args.extend(os(&["--optimizer", "fixed:2", "--duration", "5s"]));
    let stdout = sim_ok(&args);
    let text = String::from_utf8_lossy(&stdout);
    assert!(text.contains("fixed:2 on mine (seed 1)"), "{text}");
}

#[test]
fn a_schedule_sets_the_count_from_its_first_interval_and_sits_in_a_list() {
    let stdout = sim_ok(&os(&[
        "--scenario",
        "paper-fig2",
        "--optimizer",
        "schedule:0s:2,5s:6",
        "--duration",
        "10s",
        "--json",
    ]));
    let lines = json_lines(&stdout);
    let counts: Vec<u64> = lines[..10]
        .iter()
        .map(|mi| mi["streams"].as_u64().unwrap())
        .collect();
    assert_eq!(counts, [2, 2, 2, 2, 2, 6, 6, 6, 6, 6]);
    assert_eq!(lines[10]["controller"], "schedule:0s:2,5s:6");

    let summaries = json_lines(&sim_ok(&os(&[
        "--scenario",
        "paper-fig2",
        "--optimizer",
        "gd,schedule:0s:2,5s:6,fixed:3",
        "--duration",
        "10s",
        "--json",
    ])));
    let names: Vec<_> = summaries.iter().map(|s| s["controller"].clone()).collect();
    assert_eq!(names, ["gd", "schedule:0s:2,5s:6", "fixed:3"]);
}

#[test]
fn bad_scenarios_and_optimizers_are_named() {
    let (_dir, path) = scenario_file("bad", 0);
    for (args, expected) in [
        (vec!["--scenario", "nowhere"], "neither a shipped scenario"),
        (
            vec!["--scenario", path.to_str().unwrap()],
            "capacity_mbps must be a positive number",
        ),
        (
            vec!["--scenario", "paper-fig2", "--optimizer", "magic"],
            "unknown optimizer",
        ),
        (
            vec!["--scenario", "random:wild:1"],
            "unknown scenario family \"wild\"",
        ),
        (vec!["--scenario", "random:lossy:x"], "\"x\" is not a seed"),
        (
            vec!["--scenario", "paper-fig2", "--optimizer", "ppo", "--b", "3"],
            "trained for the utility K=1.02 B=10",
        ),
        (
            vec![
                "--scenario",
                "paper-fig2",
                "--optimizer",
                "auto",
                "--k",
                "1.1",
            ],
            "trained for the utility K=1.02 B=10",
        ),
        (
            vec!["--scenario", "paper-fig2", "--duration", "0s"],
            "not a positive time",
        ),
        (vec!["--scenario", "all,nowhere"], "\"nowhere\" is neither"),
        (
            vec!["--scenario", "all", "--optimizer", "gd,"],
            "unknown optimizer \"\"",
        ),
        (
            vec!["--scenario", "all", "--optimizer", "schedule:0s:1,4s:0"],
            "bad stream-count schedule \"0s:1,4s:0\" (in \"4s:0\": \"0\" is not a count",
        ),
    ] {
        let out = xfer().arg("sim").args(&args).output().unwrap();
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(expected), "{args:?}: {err}");
    }
}

#[test]
fn auto_logs_who_acts_and_why_control_changed_hands() {
    // background-arrives: best 20 streams; background flows take half the link at 100 s.
    let stdout = sim_ok(&os(&[
        "--scenario",
        "background-arrives",
        "--optimizer",
        "auto",
        "--seed",
        "2",
        "--json",
    ]));
    let lines = json_lines(&stdout);
    let (summary, mis) = lines.split_last().unwrap();
    let mut acting = "ppo";
    let mut switches = Vec::new();
    for mi in mis {
        let now = mi["acting"].as_str().unwrap_or_else(|| panic!("{mi}"));
        assert!(["ppo", "tuner"].contains(&now), "{mi}");
        match mi["switch"].as_str() {
            Some(why) => switches.push((mi["mi"].as_u64().unwrap(), now, why.to_owned())),
            None => assert_eq!(now, acting, "control changed hands without a reason: {mi}"),
        }
        acting = now;
    }
    assert_eq!(switches[0].1, "tuner", "{switches:?}");
    assert!(
        ["the policy holds", "the policy keeps reversing"]
            .iter()
            .any(|why| switches[0].2.starts_with(why)),
        "{switches:?}"
    );
    assert!(
        switches.iter().any(|(mi, who, why)| (100..110).contains(mi)
            && *who == "tuner"
            && why.contains("the path changed; exploring up")),
        "the arrival of background traffic makes the tuner explore: {switches:?}"
    );
    assert_eq!(summary["controller"], "auto");
    // This path is the shipped policy's weakest (a deeper buffer and more background flows
    // than any training path; docs/experiments/2026-11-26-the-shipped-policies-notebook.md,
    // "Where it is weakest").
    let utility = summary["utility_fraction"].as_f64().unwrap();
    assert!(utility > 0.9, "{summary}");
}

#[test]
fn several_scenarios_controllers_and_seeds_give_one_summary_per_run_and_a_table() {
    let args = [
        "--scenario",
        "paper-fig2,cloudlab-1g",
        "--optimizer",
        "gd,bo",
        "--seeds",
        "2",
        "--seed",
        "7",
        "--duration",
        "30s",
    ];
    let mut json_args = os(&args);
    json_args.extend(os(&["--json"]));
    let summaries = json_lines(&sim_ok(&json_args));
    let runs: Vec<_> = summaries
        .iter()
        .map(|s| {
            assert_eq!(s["type"], "summary");
            assert!(s["utility_fraction"].as_f64().unwrap() > 0.3, "{s}");
            (
                s["scenario"].as_str().unwrap().to_string(),
                s["controller"].as_str().unwrap().to_string(),
                s["seed"].as_u64().unwrap(),
            )
        })
        .collect();
    let mut expected = Vec::new();
    for scenario in ["paper-fig2", "cloudlab-1g"] {
        for controller in ["gd", "bo"] {
            for seed in [7, 8] {
                expected.push((scenario.to_string(), controller.to_string(), seed));
            }
        }
    }
    assert_eq!(runs, expected);

    let table = String::from_utf8(sim_ok(&os(&args))).unwrap();
    let lines: Vec<_> = table.lines().collect();
    assert!(lines[0].starts_with("scenario"), "{table}");
    for (line, (scenario, controller)) in lines[1..5].iter().zip([
        ("paper-fig2", "gd"),
        ("paper-fig2", "bo"),
        ("cloudlab-1g", "gd"),
        ("cloudlab-1g", "bo"),
    ]) {
        let fields: Vec<_> = line.split_whitespace().collect();
        assert_eq!(&fields[..3], &[scenario, controller, "2"], "{table}");
    }
}

#[test]
fn without_an_optimizer_auto_runs_or_gd_for_a_utility_the_policy_does_not_know() {
    let summary = |extra: &[&str]| {
        let out = xfer()
            .arg("sim")
            .args(["--scenario", "paper-fig2", "--duration", "10s", "--json"])
            .args(extra)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        let lines = json_lines(&out.stdout);
        (lines.last().unwrap()["controller"].clone(), stderr)
    };
    let (controller, stderr) = summary(&[]);
    assert_eq!(controller, "auto");
    assert!(stderr.is_empty(), "{stderr}");
    let (controller, stderr) = summary(&["--k", "1.05"]);
    assert_eq!(controller, "gd");
    assert!(
        stderr.contains("trained for K=1.02 B=10, not for K=1.05 B=10, so gd"),
        "{stderr}"
    );
}
