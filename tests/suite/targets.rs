//! Target ids and selections.

use fk_agentd::target::{Catalog, TargetError, TargetId};
use pretty_assertions::assert_eq;

fn ids(v: &[TargetId]) -> Vec<String> {
    v.iter().map(ToString::to_string).collect()
}

#[test]
fn the_embedded_catalog_holds_the_133_default_targets() {
    let c = Catalog::embedded();
    let per_level = |l| c.targets().iter().filter(|t| t.id.level() == l).count();
    assert_eq!(
        (c.targets().len(), per_level(1), per_level(2), per_level(3)),
        (133, 47, 64, 22)
    );
    let gelu = c.get(&"L1/gelu".parse().unwrap()).unwrap();
    assert_eq!(gelu.classes, vec!["GELU".to_string()]);
}

#[test]
fn ranges_levels_lists_and_all_select_the_right_targets() {
    let c = Catalog::embedded();
    assert_eq!(c.select("L1-L3").unwrap().len(), 133);
    assert_eq!(c.select("L1-3").unwrap().len(), 133);
    assert_eq!(c.select("all").unwrap().len(), 133);
    assert_eq!(c.select("L2").unwrap().len(), 64);
    assert_eq!(c.select("L1,L3").unwrap().len(), 47 + 22);
    assert_eq!(c.select("L2-L3").unwrap().len(), 64 + 22);
}

#[test]
fn explicit_ids_are_deduplicated_and_ordered_by_level_then_name() {
    let c = Catalog::embedded();
    let got = c
        .select("L2/rms_norm_gated_silu_mul,L1/gelu,L1/bmm,L1/gelu")
        .err();
    // L2/rms_norm_gated_silu_mul does not exist: the whole selection is refused.
    assert!(matches!(got, Some(TargetError::UnknownTarget { .. })));
    let got = c
        .select("L3/yolov10_backbone,L1/gelu,L1/bmm,L1/gelu")
        .unwrap();
    assert_eq!(ids(&got), ["L1/bmm", "L1/gelu", "L3/yolov10_backbone"]);
    let mixed = c.select("L1/gelu,L1").unwrap();
    assert_eq!(
        mixed.len(),
        47,
        "a target inside a selected level is not counted twice"
    );
}

#[test]
fn an_unknown_id_names_the_nearest_valid_ones() {
    let err = Catalog::embedded().select("L1/gleu").unwrap_err();
    let text = err.to_string();
    assert!(text.contains("unknown target `L1/gleu`"), "{text}");
    assert!(text.contains("L1/gelu"), "{text}");
}

#[test]
fn an_unknown_level_lists_the_levels_there_are() {
    let err = Catalog::embedded().select("L9").unwrap_err();
    assert_eq!(
        err,
        TargetError::UnknownLevel {
            value: "L9".into(),
            known: "L1, L2, L3".into()
        }
    );
    assert!(Catalog::embedded().select("L1-L9").is_err());
    assert!(
        Catalog::embedded()
            .select("L3-L1")
            .unwrap_err()
            .to_string()
            .contains("L1-L3")
    );
}

#[test]
fn odd_characters_in_ids_are_refused_because_ids_become_paths() {
    for bad in [
        "L1/../etc",
        "L1/gelu;rm",
        "L1/Gelu",
        "L1/a b",
        "L1/",
        "L5/gelu",
        "gelu/L1",
    ] {
        let err = bad.parse::<TargetId>();
        assert!(err.is_err(), "{bad} was accepted");
    }
    assert!(Catalog::embedded().select("L1/../../x").is_err());
    assert!(matches!(
        Catalog::embedded().select("  "),
        Err(TargetError::Empty)
    ));
    // A stray space or an empty item is a slip, not a smaller selection.
    for slip in [" , ", "L1,,L2", "L1/gelu ", "L1,"] {
        assert!(
            matches!(
                Catalog::embedded().select(slip),
                Err(TargetError::Malformed { .. })
            ),
            "{slip:?}"
        );
    }
}

#[test]
fn a_target_id_round_trips_through_text_and_json() {
    let id: TargetId = "L2/rms_norm".parse().unwrap();
    assert_eq!(
        (id.level(), id.stem(), id.candidate_path()),
        (2, "rms_norm", "L2/rms_norm.py".to_string())
    );
    let json = serde_json::to_string(&id).unwrap();
    assert_eq!(json, "\"L2/rms_norm\"");
    assert_eq!(serde_json::from_str::<TargetId>(&json).unwrap(), id);
    assert!(serde_json::from_str::<TargetId>("\"L2/../x\"").is_err());
}

fn write(path: &std::path::Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn load(
    home: &std::path::Path,
    targets: &str,
    fk_dir: Option<&std::path::Path>,
) -> Result<fk_agentd::config::Config, String> {
    let flags = fk_agentd::config::Flags {
        home: Some(home.to_path_buf()),
        targets: Some(targets.into()),
        sim: true,
        ..Default::default()
    };
    let env = fk_agentd::config::Env {
        cwd: home.to_path_buf(),
        fk_dir: fk_dir.map(|d| d.display().to_string()),
        ..Default::default()
    };
    fk_agentd::config::Config::load(&flags, &env, &Catalog::embedded()).map_err(|e| e.to_string())
}

#[test]
fn a_checkout_widens_the_catalog_by_id_while_levels_keep_the_default_list() {
    let tmp = tempfile::tempdir().unwrap();
    let fk = tmp.path().join("fastkernels-checkout");
    write(
        &fk.join("fastkernels/tasks/baseline/L1/gelu.py"),
        "class GELU:\n    pass\n",
    );
    write(
        &fk.join("fastkernels/tasks/baseline/L2/new_block.py"),
        "class NewBlock:\n    pass\n",
    );
    let home = tmp.path().join("home");
    write(&home.join("fk-agentd.toml"), "");
    let config = load(&home, "L2/new_block,L1/gelu", Some(&fk)).unwrap();
    assert_eq!(ids(&config.targets), ["L1/gelu", "L2/new_block"]);
    let block = config
        .catalog
        .get(&"L2/new_block".parse().unwrap())
        .unwrap();
    assert_eq!(block.classes, ["NewBlock"]);
    // The default selection is still the 133 ids, checkout or not.
    assert_eq!(load(&home, "L1-L3", Some(&fk)).unwrap().targets.len(), 133);
    let wide = config.catalog.clone();
    assert_eq!(wide.select("L2").unwrap().len(), 64);
    assert!(!wide.is_default(&"L2/new_block".parse().unwrap()));
    // An id neither the default list, the checkout nor the captures know is still refused.
    let err = load(&home, "L2/new_blok", Some(&fk)).unwrap_err();
    assert!(
        err.contains("campaign.targets (--targets)") && err.contains("L2/new_block"),
        "{err}"
    );
}

#[test]
fn captured_selects_the_targets_with_a_forward_case_and_ids_only_the_captures_name() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    let h200 = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("captures/default/h200");
    write(
        &home.join("fk-agentd.toml"),
        &format!("[campaign]\ncaptures = {:?}\n", h200.display().to_string()),
    );
    let config = load(&home, "captured", None).unwrap();
    assert_eq!(
        ids(&config.targets),
        [
            "L1/embedding",
            "L1/flash_attn_varlen",
            "L1/gelu",
            "L1/l2_norm",
            "L1/layer_norm",
            "L1/linear",
            "L2/encoder_mlp"
        ]
    );
    // Init-only operators of the captures are selectable by id (doctor and start then list
    // them as SKIP(no captured case)).
    let config = load(
        &home,
        "L2/encoder_embeddings,L3/xlm_roberta_layer,captured",
        None,
    )
    .unwrap();
    assert_eq!(config.targets.len(), 9);
    let class = &config
        .catalog
        .get(&"L2/encoder_embeddings".parse().unwrap())
        .unwrap()
        .classes;
    assert_eq!(class, &["XLMRobertaEmbeddings"]);
}

#[test]
fn captured_with_captures_that_hold_no_forward_case_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    let caps = tmp.path().join("caps");
    write(
        &caps.join("r.json"),
        r#"{"model":"m","operators":{"fastkernels.tasks.baseline.L1.gelu:GELU":{"init":{"calls":1,"variants":[]}}}}"#,
    );
    write(
        &home.join("fk-agentd.toml"),
        &format!("[campaign]\ncaptures = {:?}\n", caps.display().to_string()),
    );
    let err = load(&home, "captured", None).unwrap_err();
    assert!(err.contains("no target has a forward case"), "{err}");
}
