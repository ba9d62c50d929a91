//! apply_patch: the envelope grammar and hunk application on text.

use fk_agentd::tools::patch::{FileOp, Hunk, HunkLine, PatchError, apply_hunks, parse};
use pretty_assertions::assert_eq;

fn ctx(s: &str) -> HunkLine {
    HunkLine::Context(s.into())
}
fn del(s: &str) -> HunkLine {
    HunkLine::Remove(s.into())
}
fn add(s: &str) -> HunkLine {
    HunkLine::Add(s.into())
}

#[test]
fn parses_every_operation_kind() {
    let patch = "*** Begin Patch
*** Add File: a.py
+x = 1

*** Delete File: b.py
*** Update File: c.py
*** Move to: d.py
@@ def f():
 a
-b
+B
@@
 z
+end
*** End of File
*** End Patch
";
    assert_eq!(
        parse(patch),
        Ok(vec![
            FileOp::Add {
                path: "a.py".into(),
                contents: "x = 1\n".into()
            },
            FileOp::Delete {
                path: "b.py".into()
            },
            FileOp::Update {
                path: "c.py".into(),
                move_to: Some("d.py".into()),
                hunks: vec![
                    Hunk {
                        anchor: Some("def f():".into()),
                        lines: vec![ctx("a"), del("b"), add("B")],
                        at_eof: false,
                    },
                    Hunk {
                        anchor: None,
                        lines: vec![ctx("z"), add("end")],
                        at_eof: true,
                    },
                ],
            },
        ])
    );
}

#[test]
fn syntax_errors_name_the_line() {
    let cases = [
        (
            "*** Begin Patch\n*** End Patch",
            1,
            "the patch has no file operations",
        ),
        (
            "*** Begin Patch\n*** Add File: a\nno plus\n*** End Patch",
            3,
            "every line of an added file must start with `+`, found `no plus`",
        ),
        (
            "*** Begin Patch\n*** Update File: a\n@@\n?x\n*** End Patch",
            4,
            "a hunk line must start with ` ` (context), `-` or `+`, found `?x`",
        ),
        (
            "*** Begin Patch\n*** Update File: a\n*** End Patch",
            2,
            "`*** Update File` needs at least one hunk",
        ),
        (
            "*** Begin Patch\n*** Rename File: a\n*** End Patch",
            2,
            "expected `*** Add File: `, `*** Delete File: ` or `*** Update File: `, found `*** Rename File: a`",
        ),
        (
            "*** Begin Patch\n*** Delete File: a\n",
            2,
            "the patch must end with `*** End Patch`",
        ),
    ];
    for (patch, line, why) in cases {
        assert_eq!(
            parse(patch),
            Err(PatchError::Syntax {
                line,
                why: why.into()
            }),
            "{patch}"
        );
    }
}

fn hunk(anchor: Option<&str>, lines: Vec<HunkLine>, at_eof: bool) -> Hunk {
    Hunk {
        anchor: anchor.map(str::to_string),
        lines,
        at_eof,
    }
}

#[test]
fn anchors_pick_the_occurrence_and_hunks_apply_in_order() {
    let text = "def a():\n    return 0\n\ndef b():\n    return 0\n";
    let hunks = vec![
        hunk(
            Some("def b():"),
            vec![del("    return 0"), add("    return 2")],
            false,
        ),
        hunk(None, vec![add("# tail")], true),
    ];
    assert_eq!(
        apply_hunks("m.py", text, &hunks),
        Ok("def a():\n    return 0\n\ndef b():\n    return 2\n# tail\n".into())
    );
}

#[test]
fn whitespace_blind_match_keeps_the_files_indentation() {
    let text = "class G:\n    def forward(self, x):\n        return x\n";
    let hunks = vec![hunk(
        None,
        vec![
            ctx("def forward(self, x):"),
            del("return x"),
            add("        return x * 2"),
        ],
        false,
    )];
    assert_eq!(
        apply_hunks("g.py", text, &hunks),
        Ok("class G:\n    def forward(self, x):\n        return x * 2\n".into())
    );
}

#[test]
fn a_hunk_that_does_not_match_says_which_and_why() {
    let text = "a\nb\n";
    assert_eq!(
        apply_hunks("f", text, &[hunk(Some("zzz"), vec![add("c")], false)]),
        Err(PatchError::NoMatch {
            path: "f".into(),
            hunk: 1,
            why: "the `@@ zzz` line was not found".into()
        })
    );
    assert_eq!(
        apply_hunks("f", text, &[hunk(None, vec![ctx("a"), add("x")], true)]),
        Err(PatchError::NoMatch {
            path: "f".into(),
            hunk: 1,
            why: "these lines were not found at the end of the file:\na".into()
        })
    );
    // The second hunk is searched after the first, so it cannot re-match line 1.
    let twice = [
        hunk(None, vec![del("a"), add("A")], false),
        hunk(None, vec![del("a"), add("A")], false),
    ];
    assert_eq!(
        apply_hunks("f", text, &twice).unwrap_err().to_string(),
        "hunk 2 of `f` did not match the file: these lines were not found:\na"
    );
}
