//! The last line behind confinement: the provider token taken out of text that came from
//! outside fk-agentd (shell output, codex's lines, a server's error body) before it is stored
//! or shown, in the forms a leak takes: as it is, reversed, hex, base64 and base32 (at every
//! alignment, whatever the line wrapping) and gzip then base64.
//!
//! Fixed forms are replaced directly. Runs of base64 or base32 characters (line breaks
//! included, so `base64` wrapped at 76 columns counts) are decoded at each alignment; a run
//! whose bytes, or whose bytes gunzipped, hold the token is replaced whole.

use std::io::Read;

use data_encoding::{BASE32_NOPAD, BASE64_NOPAD, Encoding, HEXLOWER, HEXUPPER};

/// What replaces a form of the token.
pub const REDACTED: &str = "[REDACTED]";

/// Forms shorter than this are not looked for (they would match ordinary text).
const MIN_FORM: usize = 8;
/// Runs shorter than this cannot hold an encoded token worth finding.
const MIN_RUN: usize = 16;
/// How much a gzip stream is allowed to expand while it is searched.
const MAX_GUNZIP: u64 = 1 << 20;

/// The largest file rewritten through the scrubber; a larger one holding output of agent code
/// is replaced by a note (output that big is not read back by anyone).
pub const MAX_SCRUBBED: u64 = 16 << 20;

/// Rewrites `path` without the provider token (`scrub`: the text with every form of it taken
/// out), where it held one: files agent code wrote or printed into (a lease's spooled output,
/// a bench's JSON and logs) must not keep the token in the home when that code could read it
/// (`[security] allow_unconfined`). A file that cannot be rewritten is removed.
pub fn scrub_file(path: &std::path::Path, scrub: &(dyn Fn(&str) -> String + Send + Sync)) {
    let Ok(meta) = std::fs::metadata(path) else {
        return;
    };
    let kept = if meta.len() > MAX_SCRUBBED {
        format!(
            "[fk-agentd: {} bytes of output removed: too large to check for the provider token]\n",
            meta.len()
        )
    } else {
        let Ok(bytes) = std::fs::read(path) else {
            return;
        };
        let text = String::from_utf8_lossy(&bytes);
        let clean = scrub(&text);
        if clean == text {
            return;
        }
        clean
    };
    let tmp = path.with_extension("scrubbed");
    if let Err(e) = std::fs::write(&tmp, kept).and_then(|()| std::fs::rename(&tmp, path)) {
        tracing::warn!(path = %path.display(), error = %e, "cannot rewrite a file without the token; removing it");
        let _ = std::fs::remove_file(&tmp);
        let _ = std::fs::remove_file(path);
    }
}

/// What the secret files hold now (a token file's token, trimmed; empty and unreadable ones
/// left out), for [`scrub_tree_since`].
pub fn read_secrets(files: &[std::path::PathBuf]) -> Vec<secrecy::SecretString> {
    files
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
        .map(secrecy::SecretString::from)
        .collect()
}

/// Every file at or under `path` changed since `since` rewritten without any form of any of
/// `secrets` ([`scrub_file`]): what a leased command wrote (a bench's JSON and logs, a
/// profiler's report, its spooled output) when it could read a secret file.
pub fn scrub_tree_since(
    path: &std::path::Path,
    since: std::time::SystemTime,
    secrets: &[secrecy::SecretString],
) {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return;
    };
    if meta.is_dir() {
        for entry in std::fs::read_dir(path).into_iter().flatten().flatten() {
            scrub_tree_since(&entry.path(), since, secrets);
        }
    } else if meta.is_file()
        && meta.len() <= MAX_SCRUBBED
        && meta.modified().is_ok_and(|m| m >= since)
    {
        // (A larger file, a profiler's report, is kept as it is.)
        scrub_file(path, &|text| redact_all(text, secrets));
    }
}

/// `text` with every form of each of `secrets` replaced ([`redact`]).
pub fn redact_all(text: &str, secrets: &[secrecy::SecretString]) -> String {
    use secrecy::ExposeSecret;
    secrets
        .iter()
        .fold(text.to_string(), |t, s| redact(&t, s.expose_secret()))
}

/// `text` with every form of `token` found in it replaced by [`REDACTED`].
pub fn redact(text: &str, token: &str) -> String {
    if token.len() < MIN_FORM {
        return text.replace(token, REDACTED);
    }
    let mut out = text.to_string();
    for form in fixed_forms(token.as_bytes()) {
        if form.len() >= MIN_FORM && out.contains(&form) {
            out = out.replace(&form, REDACTED);
        }
    }
    for (alphabet, encoding, group) in [
        (is_base64 as fn(char) -> bool, &BASE64_NOPAD, 4),
        (is_base32, &BASE32_NOPAD, 8),
    ] {
        out = redact_runs(&out, token.as_bytes(), alphabet, encoding, group);
    }
    out
}

/// The token as it is, reversed, in hex, and base64/base32 of it at every alignment (the
/// part of the encoding that does not depend on the bytes around it).
fn fixed_forms(token: &[u8]) -> Vec<String> {
    let mut forms = vec![
        String::from_utf8_lossy(token).into_owned(),
        String::from_utf8_lossy(token).chars().rev().collect(),
        HEXLOWER.encode(token),
        HEXUPPER.encode(token),
    ];
    for (encoding, group) in [(&BASE64_NOPAD, 3), (&BASE32_NOPAD, 5)] {
        for shift in 0..group {
            let rest = &token[shift.min(token.len())..];
            let whole = rest.len() / group * group;
            if whole > 0 {
                forms.push(encoding.encode(&rest[..whole]));
            }
        }
    }
    forms
}

fn is_base64(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '+' | '/' | '-' | '_')
}

fn is_base32(c: char) -> bool {
    c.is_ascii_uppercase() || ('2'..='7').contains(&c)
}

/// Replaces every run of `alphabet` characters (line breaks and padding inside included)
/// whose decoding at some alignment holds the token, as it is or gzipped.
fn redact_runs(
    text: &str,
    token: &[u8],
    alphabet: fn(char) -> bool,
    encoding: &Encoding,
    group: usize,
) -> String {
    let in_run = |c: char| alphabet(c) || matches!(c, '=' | '\n' | '\r');
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find(alphabet) {
        out.push_str(&rest[..start]);
        let len = rest[start..]
            .find(|c: char| !in_run(c))
            .unwrap_or(rest.len() - start);
        let run = &rest[start..start + len];
        let holds = |lines: &[&str]| holds_token(&lines.concat(), token, alphabet, encoding, group);
        let lines: Vec<&str> = run.split_inclusive('\n').collect();
        if holds(&lines) {
            // A run crosses line breaks (wrapped encodings) and so may take in the words of
            // the lines around it: only the fewest whole lines that hold the token go.
            let mut end = lines.len();
            while end > 1 && holds(&lines[..end - 1]) {
                end -= 1;
            }
            let mut first = 0;
            while first + 1 < end && holds(&lines[first + 1..end]) {
                first += 1;
            }
            out.push_str(&lines[..first].concat());
            out.push_str(REDACTED);
            if lines[end - 1].ends_with('\n') {
                out.push('\n');
            }
            out.push_str(&lines[end..].concat());
        } else {
            out.push_str(run);
        }
        rest = &rest[start + len..];
    }
    out.push_str(rest);
    out
}

fn holds_token(
    run: &str,
    token: &[u8],
    alphabet: fn(char) -> bool,
    encoding: &Encoding,
    group: usize,
) -> bool {
    let chars: String = run.chars().filter(|&c| alphabet(c)).collect();
    if chars.len() < MIN_RUN {
        return false;
    }
    // The url-safe alphabet decodes as the standard one.
    let chars = chars.replace('-', "+").replace('_', "/");
    (0..group).any(|skip| {
        let body = &chars[skip..];
        // A whole encoding ends on a full group or a valid partial one; try both lengths.
        let whole = body.len() / group * group;
        [body.len(), whole].into_iter().any(|n| {
            encoding
                .decode(&body.as_bytes()[..n])
                .is_ok_and(|bytes| contains(&bytes, token) || gunzipped_holds(&bytes, token))
        })
    })
}

fn gunzipped_holds(bytes: &[u8], token: &[u8]) -> bool {
    if !bytes.starts_with(&[0x1f, 0x8b]) {
        return false;
    }
    let mut out = Vec::new();
    // A cut or padded stream still yields what it held before the damage.
    let _ = flate2::read::MultiGzDecoder::new(bytes)
        .take(MAX_GUNZIP)
        .read_to_end(&mut out);
    contains(&out, token)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    const TOKEN: &str = "fk-pat-9c41e7d0a2b35f68";

    #[test]
    fn a_sweep_rewrites_only_what_changed_since_and_keeps_large_files() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| {
            let p = dir.path().join(name);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, text).unwrap();
            p
        };
        let before = write("old.log", &format!("old {TOKEN}"));
        let since = std::fs::metadata(&before).unwrap().modified().unwrap()
            + std::time::Duration::from_millis(1);
        let after = write("results/bench.json", &format!("{{\"e\": \"{TOKEN}\"}}"));
        let later = std::time::SystemTime::now() + std::time::Duration::from_secs(1);
        std::fs::File::options()
            .write(true)
            .open(&after)
            .unwrap()
            .set_modified(later)
            .unwrap();
        let large = write("report.ncu-rep", "");
        std::fs::File::options()
            .write(true)
            .open(&large)
            .unwrap()
            .set_len(MAX_SCRUBBED + 1)
            .unwrap();
        let secret_dir = tempfile::tempdir().unwrap();
        let secret_file = secret_dir.path().join("token");
        std::fs::write(&secret_file, format!("{TOKEN}\n")).unwrap();
        let secrets = read_secrets(&[secret_file, secret_dir.path().join("absent")]);
        scrub_tree_since(dir.path(), since, &secrets);
        let read = |p: &std::path::Path| std::fs::read_to_string(p).unwrap();
        assert_eq!(read(&before), format!("old {TOKEN}"));
        assert_eq!(read(&after), format!("{{\"e\": \"{REDACTED}\"}}"));
        assert_eq!(std::fs::metadata(&large).unwrap().len(), MAX_SCRUBBED + 1);
    }

    fn wrap(s: &str, width: usize) -> String {
        s.as_bytes()
            .chunks(width)
            .map(|c| String::from_utf8_lossy(c).into_owned())
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(bytes).unwrap();
        e.finish().unwrap()
    }

    #[test]
    fn every_form_of_the_token_is_taken_out_and_the_rest_kept() {
        let file = format!("{TOKEN}\n");
        let b64 = data_encoding::BASE64.encode(file.as_bytes());
        let forms = [
            TOKEN.to_string(),
            TOKEN.chars().rev().collect(),
            HEXLOWER.encode(file.as_bytes()),
            b64.clone(),
            wrap(
                &data_encoding::BASE64.encode(format!("x{file}").as_bytes()),
                4,
            ),
            data_encoding::BASE64URL.encode(format!("ab{file}").as_bytes()),
            data_encoding::BASE32.encode(file.as_bytes()),
            wrap(
                &data_encoding::BASE32.encode(format!("abc{file}").as_bytes()),
                76,
            ),
            data_encoding::BASE64.encode(&gzip(file.as_bytes())),
            wrap(
                &data_encoding::BASE64.encode(&gzip(format!("header\n{file}").as_bytes())),
                76,
            ),
        ];
        for form in forms {
            let text = format!("before {form}\nafter");
            let out = redact(&text, TOKEN);
            assert!(out.contains(REDACTED), "{form} kept: {out}");
            assert!(
                out.starts_with("before ") && out.ends_with("after"),
                "{out}"
            );
            for kept in fixed_forms(TOKEN.as_bytes()) {
                assert!(!out.contains(&kept), "{out}");
            }
        }
        let plain =
            "base64 of something else: aGVsbG8gd29ybGQgaGVsbG8gd29ybGQ= and ABCDEFGHIJKLMNOP";
        assert_eq!(redact(plain, TOKEN), plain);
    }
}
