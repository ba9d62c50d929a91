//! Configuration: defaults, precedence, and errors that name their field.

use std::path::{Path, PathBuf};
use std::time::Duration;

use fk_agentd::config::provider::{ProviderConfig, ReasoningEffort, TokenSource};
use fk_agentd::config::{
    Config, ConfigError, Env, Flags, GpuDevices, Mode, SettingSource, resolve_home,
};
use fk_agentd::target::Catalog;
use pretty_assertions::assert_eq;

fn env_in(dir: &Path) -> Env {
    Env {
        home: Some("/home/tester".into()),
        cwd: dir.to_path_buf(),
        ..Env::default()
    }
}

fn load(dir: &Path, flags: Flags) -> Result<Config, ConfigError> {
    let flags = Flags {
        home: Some(dir.join("home")),
        ..flags
    };
    Config::load(&flags, &env_in(dir), &Catalog::embedded())
}

fn load_file(toml: &str) -> Result<Config, ConfigError> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fk.toml");
    std::fs::write(&path, toml).unwrap();
    load(
        dir.path(),
        Flags {
            config: Some(path),
            ..Flags::default()
        },
    )
}

#[test]
fn defaults_match_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    let c = load(dir.path(), Flags::default()).unwrap();
    assert_eq!(c.max_agents, 12);
    assert_eq!(c.session_timeout, Duration::from_secs(5 * 3600));
    assert_eq!(c.lease_timeout, Duration::from_secs(15 * 60));
    assert_eq!(c.mode, Mode::Independent);
    assert_eq!(c.targets.len(), 133);
    assert_eq!(c.gpus, GpuDevices::Nvml);
    assert_eq!((c.ncu_cap, c.nsys_cap), (1, 2));
    assert_eq!(c.provider, "cortex");
    assert_eq!(
        c.settings["campaign.max_agents"],
        ("12".to_string(), SettingSource::Default)
    );
}

#[test]
fn flags_override_the_file_and_sources_are_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fk.toml");
    std::fs::write(
        &path,
        "[campaign]\nmax_agents = 4\nsession_timeout = \"2h\"\n[gpus]\ndevices = \"fake:8\"\n",
    )
    .unwrap();
    let c = load(
        dir.path(),
        Flags {
            config: Some(path),
            max_agents: Some(6),
            targets: Some("L2".into()),
            ..Flags::default()
        },
    )
    .unwrap();
    assert_eq!(
        (c.max_agents, c.session_timeout, c.targets.len()),
        (6, Duration::from_secs(7200), 64)
    );
    assert_eq!(c.gpus, GpuDevices::Fake { count: 8 });
    assert_eq!(c.settings["campaign.max_agents"].1, SettingSource::Flag);
    assert_eq!(
        c.settings["campaign.session_timeout"].1,
        SettingSource::File
    );
    assert_eq!(c.settings["campaign.mode"].1, SettingSource::Default);
}

#[test]
fn every_bad_value_names_its_key_the_value_and_what_was_expected() {
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<(Flags, &str, &str)> = vec![
        (
            Flags {
                max_agents: Some(0),
                ..Flags::default()
            },
            "campaign.max_agents (--max-agents)",
            "0",
        ),
        (
            Flags {
                max_agents: Some(-3),
                ..Flags::default()
            },
            "campaign.max_agents (--max-agents)",
            "-3",
        ),
        (
            Flags {
                targets: Some("L9".into()),
                ..Flags::default()
            },
            "campaign.targets (--targets)",
            "L9",
        ),
        (
            Flags {
                mode: Some("parallel".into()),
                ..Flags::default()
            },
            "campaign.mode (--mode)",
            "parallel",
        ),
        (
            Flags {
                session_timeout: Some("5 hours-ish".into()),
                ..Flags::default()
            },
            "campaign.session_timeout (--session-timeout)",
            "5 hours-ish",
        ),
        (
            Flags {
                lease_timeout: Some("0s".into()),
                ..Flags::default()
            },
            "campaign.lease_timeout (--lease-timeout)",
            "0s",
        ),
        (
            Flags {
                lease_timeout: Some("6h".into()),
                ..Flags::default()
            },
            "campaign.lease_timeout (--lease-timeout)",
            "6h",
        ),
        // Durations a campaign cannot use: below or above the key's bounds.
        (
            Flags {
                lease_timeout: Some("1ns".into()),
                ..Flags::default()
            },
            "campaign.lease_timeout (--lease-timeout)",
            "1ns",
        ),
        (
            Flags {
                session_timeout: Some("100000000000h".into()),
                ..Flags::default()
            },
            "campaign.session_timeout (--session-timeout)",
            "100000000000h",
        ),
        (
            Flags {
                session_timeout: Some("8d".into()),
                ..Flags::default()
            },
            "campaign.session_timeout (--session-timeout)",
            "8d",
        ),
    ];
    for (flags, key, value) in cases {
        let err = load(dir.path(), flags).unwrap_err();
        assert_eq!(
            (err.key.as_str(), err.value.as_str()),
            (key, value),
            "{err}"
        );
        assert!(
            err.to_string().contains(key) && err.to_string().contains(value),
            "{err}"
        );
    }
}

#[test]
fn a_duration_out_of_bounds_names_the_bounds() {
    let dir = tempfile::tempdir().unwrap();
    let err = load(
        dir.path(),
        Flags {
            lease_timeout: Some("1ns".into()),
            ..Flags::default()
        },
    )
    .unwrap_err();
    assert!(err.to_string().contains("from 1s to 1day"), "{err}");
    let slurm = "[gpus]\nbackend = \"slurm\"\n[slurm]\nnodes = [\"n1\"]\nhold_time = \"30s\"\n";
    let err = load_file(slurm).unwrap_err();
    assert_eq!(
        (err.key.as_str(), err.value.as_str()),
        ("slurm.hold_time", "30s")
    );
}

#[test]
fn file_errors_name_the_key() {
    let err = load_file("[campaign]\nmax_agnets = 3\n").unwrap_err();
    assert!(err.to_string().contains("max_agnets"), "{err}");
    let err = load_file("[gpus]\ndevices = \"fake:0\"\n").unwrap_err();
    assert_eq!(
        (err.key.as_str(), err.value.as_str()),
        ("gpus.devices", "fake:0")
    );
    let err = load_file("[gpus]\ndevices = [\"not-a-uuid\"]\n").unwrap_err();
    assert_eq!(err.key, "gpus.devices");
    let err = load_file("[gpus]\ndevices = [\"GPU-a\", \"GPU-b\", \"GPU-a\"]\n").unwrap_err();
    assert_eq!(
        (err.key.as_str(), err.value.as_str()),
        ("gpus.devices", "GPU-a")
    );
    assert!(err.to_string().contains("each GPU UUID once"), "{err}");
    let err = load_file("[fastkernels]\ncommand = []\n").unwrap_err();
    assert_eq!(err.key, "fastkernels.command");
    let err = load_file("[campaign]\nmax_agents = \"twelve\"\n").unwrap_err();
    assert!(err.to_string().contains("max_agents"), "{err}");
}

#[test]
fn a_missing_config_file_given_explicitly_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let err = load(
        dir.path(),
        Flags {
            config: Some(dir.path().join("nope.toml")),
            ..Flags::default()
        },
    )
    .unwrap_err();
    assert!(err.value.ends_with("nope.toml"), "{err}");
}

#[test]
fn home_comes_from_the_flag_then_env_then_xdg_state() {
    let env = Env {
        fk_agentd_home: Some("/srv/fk".into()),
        xdg_state_home: Some("/xdg".into()),
        home: Some("/home/u".into()),
        cwd: PathBuf::from("/srv/cwd"),
        ..Env::default()
    };
    assert_eq!(
        resolve_home(Some(Path::new("rel")), &env).unwrap(),
        PathBuf::from("/srv/cwd/rel")
    );
    assert_eq!(resolve_home(None, &env).unwrap(), PathBuf::from("/srv/fk"));
    let env = Env {
        fk_agentd_home: None,
        ..env
    };
    assert_eq!(
        resolve_home(None, &env).unwrap(),
        PathBuf::from("/xdg/fk-agentd")
    );
    let env = Env {
        xdg_state_home: None,
        ..env
    };
    assert_eq!(
        resolve_home(None, &env).unwrap(),
        PathBuf::from("/home/u/.local/state/fk-agentd")
    );
}

#[test]
fn fk_dir_from_the_environment_overrides_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fk.toml");
    std::fs::write(&path, "[fastkernels]\ndir = \"/from/file\"\n").unwrap();
    let from_env = dir.path().join("from-env");
    std::fs::create_dir(&from_env).unwrap();
    let env = Env {
        fk_dir: Some(from_env.display().to_string()),
        ..env_in(dir.path())
    };
    let flags = Flags {
        home: Some(dir.path().join("h")),
        config: Some(path),
        ..Flags::default()
    };
    let c = Config::load(&flags, &env, &Catalog::embedded()).unwrap();
    assert_eq!(c.fastkernels_dir, Some(from_env));
    assert_eq!(c.settings["fastkernels.dir"].1, SettingSource::Env);
}

fn cortex_env() -> Env {
    Env {
        snowflake_account: Some("MyOrg-Acct1".into()),
        home: Some("/home/tester".into()),
        cwd: PathBuf::from("/srv/cwd"),
        ..Env::default()
    }
}

#[test]
fn the_shipped_cortex_provider_loads_with_an_account() {
    let p = ProviderConfig::load("cortex", Path::new("/nonexistent-home"), &cortex_env()).unwrap();
    assert_eq!(
        p.base_url,
        "https://myorg-acct1.snowflakecomputing.com/api/v2/cortex/v1"
    );
    assert_eq!(p.model, "openai-gpt-5.6-sol");
    assert_eq!(p.reasoning_effort, ReasoningEffort::High);
    assert_eq!(
        p.token,
        TokenSource::File {
            path: PathBuf::from("/home/tester/.snowhouse-pat")
        }
    );
    assert_eq!(
        p.headers["X-Snowflake-Authorization-Token-Type"],
        "PROGRAMMATIC_ACCESS_TOKEN"
    );
    assert_eq!(p.limits.max_retries, 5);
    assert_eq!(p.limits.stream_idle_timeout, Duration::from_secs(300));
    let openai =
        ProviderConfig::load("openai", Path::new("/nonexistent-home"), &cortex_env()).unwrap();
    assert_eq!(
        openai.token,
        TokenSource::Env {
            var: "OPENAI_API_KEY".into()
        }
    );
}

#[test]
fn cortex_without_an_account_says_how_to_set_it() {
    let env = Env {
        snowflake_account: None,
        ..cortex_env()
    };
    let err = ProviderConfig::load("cortex", Path::new("/nonexistent-home"), &env).unwrap_err();
    assert!(err.to_string().contains("SNOWFLAKE_ACCOUNT"), "{err}");
}

#[test]
fn a_model_id_with_an_effort_suffix_is_refused_with_advice() {
    let text = "base_url = \"https://x.example/v1\"\nmodel = \"gpt-5:high\"\ntoken_file = \"/t\"\n";
    let err = ProviderConfig::parse("p", "test", text, &cortex_env()).unwrap_err();
    assert_eq!(err.value, "gpt-5:high");
    assert!(
        err.to_string().contains("reasoning_effort = \"high\""),
        "{err}"
    );
}

#[test]
fn hosted_tools_and_authorization_headers_are_refused() {
    let base = "base_url = \"https://x.example/v1\"\nmodel = \"m\"\ntoken_file = \"/t\"\n";
    let err = ProviderConfig::parse(
        "p",
        "t",
        &format!("{base}tools = [\"function\", \"web_search\"]\n"),
        &cortex_env(),
    )
    .unwrap_err();
    assert_eq!(err.value, "web_search");
    let err = ProviderConfig::parse(
        "p",
        "t",
        &format!("{base}[headers]\nAuthorization = \"Bearer x\"\n"),
        &cortex_env(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("Authorization"), "{err}");
    let two = "base_url = \"https://x.example/v1\"\nmodel = \"m\"\ntoken_file = \"/t\"\ntoken_env = \"X\"\n";
    assert!(ProviderConfig::parse("p", "t", two, &cortex_env()).is_err());
}

/// Provider values a run cannot use are refused at load, each naming its field and value
/// (never accepted and then failing as if the infrastructure were down).
#[test]
fn provider_values_a_run_cannot_use_name_their_field() {
    let base = |url: &str, token: &str| format!("base_url = \"{url}\"\nmodel = \"m\"\n{token}\n");
    let ok_url = "http://[::1]:8000/v1";
    let cases = [
        (
            base("http://[::1", "token_env = \"T\""),
            "base_url",
            "http://[::1",
        ),
        (
            base("https://", "token_env = \"T\""),
            "base_url",
            "https://",
        ),
        (base(ok_url, "token_file = \"\""), "token_file", ""),
        (base(ok_url, "token_env = \" \""), "token_env", " "),
        (
            base(
                ok_url,
                "token_env = \"T\"\n[prices]\ninput = -1.0\noutput = 1.0",
            ),
            "prices.input",
            "-1",
        ),
        (
            base(
                ok_url,
                "token_env = \"T\"\n[prices]\ninput = 1.0\noutput = nan",
            ),
            "prices.output",
            "NaN",
        ),
    ];
    for (text, field, value) in cases {
        let err = ProviderConfig::parse("p", "t", &text, &cortex_env()).unwrap_err();
        assert_eq!(
            (err.key.as_str(), err.value.as_str()),
            (format!("provider p: {field}").as_str(), value),
            "{text}: {err}"
        );
    }
    // A type error names the line that holds the key.
    let err = ProviderConfig::parse("p", "p.toml", "model = 3\n", &cortex_env()).unwrap_err();
    assert!(err.to_string().contains("model = 3"), "{err}");
}

#[test]
fn empty_captures_and_a_missing_provider_under_sim_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let err = load_file("[campaign]\ncaptures = \"\"\n").unwrap_err();
    assert_eq!(
        (err.key.as_str(), err.value.as_str()),
        ("campaign.captures", "")
    );
    let err = load(
        dir.path(),
        Flags {
            sim: true,
            provider: Some(dir.path().join("missing.toml").display().to_string()),
            ..Flags::default()
        },
    )
    .unwrap_err();
    assert_eq!(err.key, "provider.use (--provider)", "{err}");
}

#[test]
fn an_unknown_provider_name_lists_the_known_ones() {
    let err =
        ProviderConfig::load("cortx", Path::new("/nonexistent-home"), &cortex_env()).unwrap_err();
    assert!(err.to_string().contains("cortex, openai"), "{err}");
}

#[test]
fn agent_slot_defaults_to_session_and_is_checked() {
    use fk_agentd::config::AgentSlot;
    let dir = tempfile::tempdir().unwrap();
    let c = load(dir.path(), Flags::default()).unwrap();
    assert_eq!(c.agent_slot, AgentSlot::Session);
    let c = load(
        dir.path(),
        Flags {
            agent_slot: Some("thinking".into()),
            ..Flags::default()
        },
    )
    .unwrap();
    assert_eq!(
        (c.agent_slot, c.settings["campaign.agent_slot"].clone()),
        (
            AgentSlot::Thinking,
            ("thinking".to_string(), SettingSource::Flag)
        )
    );
    let err = load_file("[campaign]\nagent_slot = \"gpu\"\n").unwrap_err();
    assert_eq!(
        (err.key.as_str(), err.value.as_str()),
        ("campaign.agent_slot (--agent-slot)", "gpu")
    );
}

#[test]
fn cgroup_root_defaults_to_sys_fs_cgroup_and_a_configured_one_must_exist() {
    let dir = tempfile::tempdir().unwrap();
    let c = load(dir.path(), Flags::default()).unwrap();
    assert_eq!(c.cgroup_root, Some(PathBuf::from("/sys/fs/cgroup")));
    assert_eq!(
        load_file("[gpus]\ncgroup_root = \"off\"\n")
            .unwrap()
            .cgroup_root,
        None
    );
    let err = load_file("[gpus]\ncgroup_root = \"sys/fs/cgroup\"\n").unwrap_err();
    assert_eq!(
        (err.key.as_str(), err.value.as_str()),
        ("gpus.cgroup_root", "sys/fs/cgroup")
    );
    let err = load_file("[gpus]\ncgroup_root = \"/no/such/cgroupfs\"\n").unwrap_err();
    assert!(
        err.key == "gpus.cgroup_root" && err.reason.contains("no such directory"),
        "{err}"
    );
    let there = dir.path().display().to_string();
    let c = load_file(&format!("[gpus]\ncgroup_root = \"{there}\"\n")).unwrap();
    assert_eq!(c.cgroup_root, Some(dir.path().to_path_buf()));
}

#[test]
fn timing_rounds_default_to_paired_and_a_bad_count_names_the_key() {
    let c = load_file("").unwrap();
    assert_eq!(c.timing_rounds, fk_agentd::config::DEFAULT_TIMING_ROUNDS);
    assert_eq!(
        load_file("[score]\ntiming_rounds = 0\n")
            .unwrap()
            .timing_rounds,
        0
    );
    let err = load_file("[score]\ntiming_rounds = 65\n").unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("score.timing_rounds") && text.contains("65"),
        "{text}"
    );
    assert_eq!(
        fk_agentd::error::ExitCode::exit_code(&err),
        fk_agentd::exit::EXIT_USAGE
    );
}

/// Values the simulation does not use are still checked: a provider named in the file, a
/// fastkernels folder that is not one.
#[test]
fn a_simulated_campaign_still_refuses_a_missing_provider_or_fastkernels_folder() {
    let sim = || Flags {
        sim: true,
        ..Flags::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let write = |toml: &str| {
        let path = dir.path().join("fk.toml");
        std::fs::write(&path, toml).unwrap();
        Flags {
            config: Some(path),
            ..sim()
        }
    };
    let cases = [
        (
            "[provider]\nuse = \"no-such-provider\"\n",
            "provider.use",
            "no-such-provider",
        ),
        ("[fastkernels]\ndir = \"\"\n", "fastkernels.dir", ""),
        (
            "[fastkernels]\ndir = \"/nonexistent/fastkernels\"\n",
            "fastkernels.dir",
            "/nonexistent/fastkernels",
        ),
    ];
    for (toml, key, value) in cases {
        let e = load(dir.path(), write(toml)).expect_err(toml);
        assert!(e.key.starts_with(key), "{toml}: {e}");
        assert_eq!(e.value, value, "{toml}: {e}");
    }
    // An existing folder is taken.
    let fk = dir.path().join("fastkernels");
    std::fs::create_dir(&fk).unwrap();
    let ok = load(
        dir.path(),
        write(&format!("[fastkernels]\ndir = \"{}\"\n", fk.display())),
    );
    assert_eq!(ok.unwrap().fastkernels_dir, Some(fk));
}

/// An empty run id is refused by the flag's name, before any store is opened.
#[test]
fn an_empty_run_id_names_the_flag() {
    for (args, names) in [
        (&["sessions", "--run", ""][..], "--run"),
        (&["compare", "--run", ""], "--run"),
        (&["manifest", "--run", ""], "--run"),
        (&["gpus", "--drain", ""], "--drain"),
        (&["resume", ""], "[RUN]"),
        (&["compare", "", "x"], "[RUNS]"),
    ] {
        let out = std::process::Command::new(super::support::BIN)
            .args(args)
            .env("FK_AGENTD_HOME", "/nonexistent/fk-home")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(names), "{args:?}: {err}");
    }
}
