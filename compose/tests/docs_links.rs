//! The repository's Markdown holds together: every relative link in `README.md`,
//! `ARCHITECTURE.md`, `CONTEXT.md` and `docs/**/*.md` names a file that exists, and every anchor
//! names a heading of its target by GitHub's rule. `README.md` stays a front page.
//!
//! Links to `http:`, `https:` and `mailto:` are not followed, and nothing inside a fenced code
//! block or an inline code span is a link.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};

/// The most `README.md` may weigh: a front page, with the reference in `docs/`.
const README_MAX_BYTES: usize = 15_000;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("the workspace root exists")
}

/// The Markdown files whose links are checked, relative to the workspace root.
fn checked_files(root: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = ["README.md", "ARCHITECTURE.md", "CONTEXT.md"]
        .iter()
        .map(PathBuf::from)
        .collect();
    let mut dirs = vec![PathBuf::from("docs")];
    let mut under_docs = Vec::new();
    while let Some(dir) = dirs.pop() {
        let entries = std::fs::read_dir(root.join(&dir))
            .unwrap_or_else(|e| panic!("{} cannot be read: {e}", dir.display()));
        for entry in entries {
            let entry = entry.expect("a directory entry");
            let rel = dir.join(entry.file_name());
            if entry.file_type().expect("a file type").is_dir() {
                dirs.push(rel);
            } else if rel.extension().is_some_and(|e| e == "md") {
                under_docs.push(rel);
            }
        }
    }
    under_docs.sort();
    files.extend(under_docs);
    files
}

/// The opening of a fenced code block: three or more backticks or tildes, indented by at most
/// three spaces.
fn fence(line: &str) -> Option<(char, usize)> {
    let trimmed = line.trim_start_matches(' ');
    if line.len() - trimmed.len() > 3 {
        return None;
    }
    let c = trimmed.chars().next()?;
    if c != '`' && c != '~' {
        return None;
    }
    let n = trimmed.chars().take_while(|&x| x == c).count();
    (n >= 3).then_some((c, n))
}

/// Each line of `text` with its number, `None` for a line inside a fenced code block (the
/// fences included).
fn prose_lines(text: &str) -> Vec<(usize, Option<&str>)> {
    let mut open: Option<(char, usize)> = None;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        match (open, fence(line)) {
            (None, Some(f)) => {
                open = Some(f);
                out.push((i + 1, None));
            }
            (Some((c, n)), Some((c2, n2)))
                if c == c2 && n2 >= n && {
                    let t = line.trim();
                    t.chars().all(|x| x == c)
                } =>
            {
                open = None;
                out.push((i + 1, None));
            }
            (Some(_), _) => out.push((i + 1, None)),
            (None, None) => out.push((i + 1, Some(line))),
        }
    }
    out
}

/// `line` with the content of every inline code span blanked (the backticks kept), so that
/// nothing inside one reads as a link. A span is closed by a run of as many backticks as opened
/// it, on the same line.
fn blank_code_spans(line: &str) -> String {
    let bytes = line.as_bytes();
    let mut out = bytes.to_vec();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'`' {
            i += 1;
            continue;
        }
        let run = bytes[i..].iter().take_while(|&&b| b == b'`').count();
        let start = i + run;
        let mut j = start;
        let mut close = None;
        while j < bytes.len() {
            if bytes[j] == b'`' {
                let r = bytes[j..].iter().take_while(|&&b| b == b'`').count();
                if r == run {
                    close = Some(j);
                    break;
                }
                j += r;
            } else {
                j += 1;
            }
        }
        match close {
            Some(end) => {
                for b in &mut out[start..end] {
                    *b = b' ';
                }
                i = end + run;
            }
            None => i = start,
        }
    }
    // Only ASCII bytes were replaced, and only whole spans between ASCII backticks.
    String::from_utf8(out).expect("still UTF-8")
}

/// The targets of the inline links (`[text](target)`, `![alt](target)`) and reference
/// definitions (`[label]: target`) on one line of prose.
fn link_targets(line: &str) -> Vec<String> {
    let line = blank_code_spans(line);
    let mut targets = Vec::new();
    let trimmed = line.trim_start();
    if trimmed.starts_with('[') {
        if let Some(close) = trimmed.find("]:") {
            if !trimmed[1..close].contains(']') {
                if let Some(t) = trimmed[close + 2..].split_whitespace().next() {
                    targets.push(t.trim_matches(|c| c == '<' || c == '>').to_string());
                }
                return targets;
            }
        }
    }
    let mut rest = line.as_str();
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let mut depth = 0usize;
        let mut end = None;
        for (k, c) in after.char_indices() {
            match c {
                '(' => depth += 1,
                ')' if depth == 0 => {
                    end = Some(k);
                    break;
                }
                ')' => depth -= 1,
                _ => {}
            }
        }
        let Some(end) = end else { break };
        let inner = after[..end].trim();
        let target = if let Some(stripped) = inner.strip_prefix('<') {
            stripped.split('>').next().unwrap_or_default()
        } else {
            inner.split_whitespace().next().unwrap_or_default()
        };
        targets.push(target.to_string());
        rest = &after[end..];
    }
    targets
}

/// `%XX` escapes decoded; anything else left as it is.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
            if let Ok(b) = u8::from_str_radix(hex, 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The text a heading shows: links reduced to their text, code spans to their content,
/// emphasis markers and HTML tags dropped.
fn heading_text(raw: &str) -> String {
    let mut text = String::new();
    let mut rest = raw;
    // `[text](target)` -> `text`
    while let Some(open) = rest.find('[') {
        let Some(mid) = rest[open..].find("](").map(|m| open + m) else {
            break;
        };
        let Some(close) = rest[mid..].find(')').map(|c| mid + c) else {
            break;
        };
        text.push_str(&rest[..open]);
        text.push_str(&rest[open + 1..mid]);
        rest = &rest[close + 1..];
    }
    text.push_str(rest);
    let mut out = String::new();
    let mut in_tag = false;
    for c in text.chars() {
        match c {
            '<' => in_tag = true,
            '>' if in_tag => in_tag = false,
            _ if in_tag => {}
            '`' | '*' => {}
            _ => out.push(c),
        }
    }
    out.trim().to_string()
}

/// GitHub's anchor for a heading: lowercased, punctuation but `-` and `_` dropped, each space
/// a `-`.
fn slug(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .collect()
}

/// Every anchor the headings of `text` make, duplicates numbered `-1`, `-2`, ... as GitHub
/// numbers them.
fn anchors(text: &str) -> Vec<String> {
    let mut headings = Vec::new();
    let lines = prose_lines(text);
    for (k, (_, line)) in lines.iter().enumerate() {
        let Some(line) = line else { continue };
        let trimmed = line.trim_start_matches(' ');
        if line.len() - trimmed.len() > 3 {
            continue;
        }
        let hashes = trimmed.chars().take_while(|&c| c == '#').count();
        if (1..=6).contains(&hashes) {
            let body = &trimmed[hashes..];
            if body.is_empty() || body.starts_with(' ') || body.starts_with('\t') {
                let body = body.trim();
                let body = body.trim_end_matches('#').trim_end();
                headings.push(heading_text(body));
                continue;
            }
        }
        // A setext heading: a line of `=` or `-` under a line of prose.
        if let Some((_, Some(next))) = lines.get(k + 1) {
            let n = next.trim();
            let underline =
                !n.is_empty() && (n.chars().all(|c| c == '=') || n.chars().all(|c| c == '-'));
            // Only a paragraph's line can be underlined into a heading, not a list item, quote,
            // table row or another heading.
            let t = line.trim();
            let paragraph = !t.is_empty()
                && !t.starts_with(['#', '-', '*', '+', '>', '|'])
                && fence(line).is_none();
            if underline && paragraph {
                headings.push(heading_text(line.trim()));
            }
        }
    }
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = Vec::new();
    for h in headings {
        let base = slug(&h);
        let n = seen.entry(base.clone()).or_insert(0);
        out.push(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// `path` with its `.` and `..` components resolved by name (a `..` past the start kept).
fn normalize(path: &Path) -> PathBuf {
    let mut out: Vec<Component> = Vec::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir if matches!(out.last(), Some(Component::Normal(_))) => {
                out.pop();
            }
            c => out.push(c),
        }
    }
    out.iter().collect()
}

/// Every broken link of `file` (relative to `root`), as `file:line: reason`.
fn broken_links(
    root: &Path,
    file: &Path,
    anchor_cache: &mut HashMap<PathBuf, Vec<String>>,
) -> Vec<String> {
    let text = std::fs::read_to_string(root.join(file))
        .unwrap_or_else(|e| panic!("{} cannot be read: {e}", file.display()));
    let dir = file.parent().unwrap_or(Path::new(""));
    let mut broken = Vec::new();
    for (number, line) in prose_lines(&text) {
        let Some(line) = line else { continue };
        for target in link_targets(line) {
            let lower = target.to_ascii_lowercase();
            if lower.starts_with("http://")
                || lower.starts_with("https://")
                || lower.starts_with("mailto:")
            {
                continue;
            }
            let where_ = format!("{}:{number}", file.display());
            if target.is_empty() {
                broken.push(format!("{where_}: a link with no target"));
                continue;
            }
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let path = percent_decode(path);
            let resolved = normalize(&if path.is_empty() {
                file.to_path_buf()
            } else if let Some(from_root) = path.strip_prefix('/') {
                PathBuf::from(from_root)
            } else {
                dir.join(&path)
            });
            let on_disk = root.join(&resolved);
            if !on_disk.exists() {
                broken.push(format!(
                    "{where_}: `{target}`: {} does not exist",
                    resolved.display()
                ));
                continue;
            }
            let Some(anchor) = anchor else { continue };
            if on_disk.extension().is_none_or(|e| e != "md") {
                continue;
            }
            let key = on_disk.canonicalize().unwrap_or(on_disk.clone());
            let known = anchor_cache
                .entry(key)
                .or_insert_with(|| anchors(&std::fs::read_to_string(&on_disk).unwrap_or_default()));
            let anchor = percent_decode(anchor).to_lowercase();
            if !known.contains(&anchor) {
                broken.push(format!(
                    "{where_}: `{target}`: {} has no heading with the anchor #{anchor}",
                    resolved.display()
                ));
            }
        }
    }
    broken
}

#[test]
fn every_relative_link_in_the_docs_resolves() {
    let root = root();
    let mut cache = HashMap::new();
    let mut broken = Vec::new();
    for file in checked_files(&root) {
        broken.extend(broken_links(&root, &file, &mut cache));
    }
    assert!(
        broken.is_empty(),
        "{} broken link(s):\n  {}",
        broken.len(),
        broken.join("\n  ")
    );
}

#[test]
fn the_readme_is_a_front_page() {
    let len = std::fs::metadata(root().join("README.md"))
        .expect("README.md exists")
        .len() as usize;
    assert!(
        len < README_MAX_BYTES,
        "README.md is {len} bytes, more than a front page's {README_MAX_BYTES}: move reference \
         material into docs/"
    );
}

#[test]
fn slugs_follow_githubs_rule() {
    assert_eq!(slug("Forming a Cluster"), "forming-a-cluster");
    assert_eq!(
        slug(&heading_text("`deploy.resources.limits`")),
        "deployresourceslimits"
    );
    assert_eq!(
        slug("HTTP/2 over TLS, 12:43 UTC"),
        "http2-over-tls-1243-utc"
    );
    assert_eq!(slug("x-pre_deploy"), "x-pre_deploy");
    assert_eq!(
        anchors("# A\n\n## A\n\n```\n# A\n```\n\nA\n-\n\n## [B](x.md) `c`\n"),
        ["a", "a-1", "a-2", "b-c"]
    );
}

#[test]
fn links_are_found_outside_code_only() {
    assert_eq!(
        link_targets("see [`a.md`](a.md#x) and ![i](img.png \"t\"), not `[c](c.md)`"),
        ["a.md#x", "img.png"]
    );
    assert_eq!(link_targets("[label]: docs/x.md#y"), ["docs/x.md#y"]);
    let lines = prose_lines("a\n```sh\n[x](y)\n```\nb [z](w)\n");
    let prose: Vec<_> = lines
        .iter()
        .filter_map(|(n, l)| l.map(|l| (*n, l)))
        .collect();
    assert_eq!(prose, [(1, "a"), (5, "b [z](w)")]);
}
