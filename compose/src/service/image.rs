//! What the container runs: `image` (or the image `build` makes), `command`, `entrypoint` and
//! `pull_policy`. An image reference Docker would refuse is refused here,
//! at load time, naming the rule it breaks.

use ployz_core::PullPolicy;

use super::shapes::{command, text};
use super::{Node, Parts, ServiceCtx};

/// Reads one of `image`, `build`, `command`, `entrypoint` or `pull_policy`.
pub(super) fn read(ctx: &mut ServiceCtx<'_>, p: &mut Parts<'_>, k: &str, value: &Node) {
    match k {
        "image" => {
            if let Some(t) = ctx.get(k, value, text) {
                match check_reference(&t) {
                    Ok(()) => p.image = Some(t),
                    Err(bad) => ctx.err(k, Some(t), bad.message, Some(&bad.fix)),
                }
            }
        }
        "build" => {
            p.build_set = !matches!(value, Node::Null);
            p.build = super::build::read(ctx, value);
        }
        "command" if !matches!(value, Node::Null) => {
            p.container.command = ctx.get(k, value, command);
        }
        "entrypoint" if !matches!(value, Node::Null) => {
            p.container.entrypoint = ctx.get(k, value, command);
        }
        "pull_policy" => {
            if let Some(policy) = ctx.get(k, value, text) {
                p.pull_policy_build = policy == "build";
                p.container.pull_policy = pull_policy(ctx, k, policy);
            }
        }
        // A null command or entrypoint keeps the image's.
        _ => {}
    }
}

/// `always`, `missing` (or `if_not_present`), `never` or `build` (the image is built: it
/// reaches the Machines from the CLI, as `missing` lets it); anything else is an error.
/// `build` without `build:` is refused in [`check_image`].
fn pull_policy(ctx: &mut ServiceCtx<'_>, k: &str, p: String) -> PullPolicy {
    match p.as_str() {
        "always" => PullPolicy::Always,
        "missing" | "if_not_present" | "build" => PullPolicy::Missing,
        "never" => PullPolicy::Never,
        _ => {
            ctx.err(
                k,
                Some(p),
                "unknown pull policy",
                Some("use always, missing (or if_not_present) or never"),
            );
            PullPolicy::Missing
        }
    }
}

/// A service needs an image: `image:`, or the one `build:` makes, named by `image:` when it is
/// given and by the project and Service otherwise (the CLI adds a tag derived from the build's
/// inputs before a Deploy). Returns the image, empty when there is none (an error was
/// recorded). No follow-on errors: a service whose `image:`, `build:` or `extends` was refused
/// is not also told it has no image.
pub(super) fn check_image(
    ctx: &mut ServiceCtx<'_>,
    image: Option<String>,
    build: Option<&super::build::BuildSpec>,
    build_set: bool,
    pull_policy_build: bool,
) -> String {
    if pull_policy_build && !build_set {
        ctx.err(
            "pull_policy",
            Some("build".to_owned()),
            "pull_policy build needs build:",
            Some("add build: with the image's context, or use pull_policy missing"),
        );
    }
    if image.is_none() && (refused(ctx, "image") || build_set || refused_extends(ctx)) {
        if let (true, Some(_)) = (build_set, build) {
            return super::build::repository(ctx);
        }
        return String::new();
    }
    if image.is_none() {
        ctx.err(
            "image",
            None,
            "the service has no image",
            Some("add image:, e.g. image: nginx:1.27, or build: with the folder it is built from"),
        );
    }
    image.unwrap_or_default()
}

/// Whether this service's `key` was refused (so another error about it would be a follow-on).
fn refused(ctx: &ServiceCtx<'_>, key: &str) -> bool {
    let service = ctx.name.as_str();
    ctx.d
        .errors
        .iter()
        .any(|e| e.service.as_deref() == Some(service) && e.key.as_deref() == Some(key))
}

/// Whether this service's `extends` was refused: its image may be the base's it could not get.
fn refused_extends(ctx: &ServiceCtx<'_>) -> bool {
    let service = ctx.name.as_str();
    ctx.d.errors.iter().any(|e| {
        e.service.as_deref() == Some(service)
            && e.key
                .as_deref()
                .is_some_and(|k| k == "extends" || k.starts_with("extends."))
    })
}

/// Why an image reference is refused, and how to write it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BadReference {
    pub(crate) message: String,
    pub(crate) fix: String,
}

impl BadReference {
    fn new(message: impl Into<String>, fix: impl Into<String>) -> Self {
        BadReference {
            message: message.into(),
            fix: fix.into(),
        }
    }
}

/// The longest repository name (domain and path) Docker accepts.
const NAME_MAX: usize = 255;

/// Checks an image reference against Docker's grammar (distribution/reference):
///
/// ```text
/// reference        := name [ ":" tag ] [ "@" digest ]
/// name             := [domain "/"] path-component ["/" path-component]*
/// domain           := host [":" port]
/// host             := domain-component ["." domain-component]* | "[" IPv6 "]"
/// domain-component := [a-zA-Z0-9] | [a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]
/// path-component   := [a-z0-9]+ (separator [a-z0-9]+)*
/// separator        := "." | "_" | "__" | "-"+
/// tag              := [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}
/// digest           := algorithm ":" hex        (algorithm [A-Za-z][A-Za-z0-9]* joined by + . _ -,
///                                                hex at least 32 hex digits)
/// ```
///
/// The first `/`-separated part is the registry host when it has a `.` or a `:`, is
/// `localhost`, or has an upper-case letter (as Docker reads it). A `{{...}}` template is
/// named as such: Ployz does not expand Go templates.
pub(crate) fn check_reference(r: &str) -> Result<(), BadReference> {
    if r.trim().is_empty() {
        return Err(BadReference::new(
            "the image must not be empty",
            "name an image, e.g. image: nginx:1.27",
        ));
    }
    if r.contains("{{") || r.contains("}}") {
        return Err(BadReference::new(
            "the image holds a template ({{...}}), which Ployz does not expand",
            "write the value, or use ${VAR} interpolation with the variable set in the environment or .env",
        ));
    }
    if let Some(c) = r.chars().find(|c| c.is_whitespace()) {
        let what = if c == ' ' {
            "a space".to_owned()
        } else {
            format!("whitespace ({c:?})")
        };
        return Err(BadReference::new(
            format!("an image reference has no whitespace, found {what}"),
            "remove the whitespace, e.g. image: nginx:1.27",
        ));
    }
    let (rest, digest) = match r.split_once('@') {
        Some((rest, digest)) => (rest, Some(digest)),
        None => (r, None),
    };
    if let Some(d) = digest {
        check_digest(d)?;
    }
    // A tag follows the last ':' that comes after the last '/' (a ':' before it is a port).
    let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match rest[last_slash..].rfind(':') {
        Some(i) => (&rest[..last_slash + i], Some(&rest[last_slash + i + 1..])),
        None => (rest, None),
    };
    if name.is_empty() {
        return Err(BadReference::new(
            "the image has no repository name before the tag or digest",
            "name the repository, e.g. image: nginx:1.27",
        ));
    }
    if let Some(t) = tag {
        check_tag(t)?;
    }
    check_name(name)
}

/// `tag := [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`.
fn check_tag(t: &str) -> Result<(), BadReference> {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    if t.is_empty() {
        return Err(BadReference::new(
            "the image's tag is empty (nothing after ':')",
            "write a tag after ':' (e.g. nginx:1.27), or drop the ':' for latest; a ${VAR} that is not set leaves the tag empty",
        ));
    }
    if t.len() > 128 {
        return Err(BadReference::new(
            format!(
                "the image's tag is {} characters long; the limit is 128",
                t.len()
            ),
            "use a shorter tag",
        ));
    }
    let mut chars = t.chars();
    let first_ok = chars.next().is_some_and(word);
    if !first_ok || !chars.all(|c| word(c) || c == '.' || c == '-') {
        return Err(BadReference::new(
            format!("the image's tag '{t}' is not valid: a tag has letters, digits, '_', '.' and '-', and does not start with '.' or '-'"),
            "fix the tag, e.g. nginx:1.27-alpine",
        ));
    }
    Ok(())
}

/// `digest := algorithm ":" hex`, the algorithm's components `[A-Za-z][A-Za-z0-9]*` joined by
/// `+`, `.`, `_` or `-`, and at least 32 hexadecimal digits.
fn check_digest(d: &str) -> Result<(), BadReference> {
    let fix = "write the digest as algorithm:hex, e.g. @sha256:<64 hexadecimal digits>";
    let rule = "a digest is algorithm:hex, e.g. sha256: and at least 32 hexadecimal digits";
    let Some((algo, hex)) = d.split_once(':') else {
        return Err(BadReference::new(
            format!("the image's digest '{d}' is not valid: {rule}"),
            fix,
        ));
    };
    let algo_ok = algo.split(['+', '.', '_', '-']).all(|part| {
        let mut c = part.chars();
        c.next().is_some_and(|f| f.is_ascii_alphabetic()) && c.all(|c| c.is_ascii_alphanumeric())
    });
    let hex_ok = hex.len() >= 32 && hex.chars().all(|c| c.is_ascii_hexdigit());
    if !algo_ok || !hex_ok {
        return Err(BadReference::new(
            format!("the image's digest '{d}' is not valid: {rule}"),
            fix,
        ));
    }
    Ok(())
}

/// `name := [domain "/"] path-component ["/" path-component]*`, 255 characters at most.
fn check_name(name: &str) -> Result<(), BadReference> {
    if name.len() > NAME_MAX {
        return Err(BadReference::new(
            format!(
                "the image's repository name is {} characters long; the limit is {NAME_MAX}",
                name.len()
            ),
            "use a shorter repository name",
        ));
    }
    let (domain, path) = match name.split_once('/') {
        Some((first, rest)) if is_domain(first) => (Some(first), rest),
        _ => (None, name),
    };
    if let Some(d) = domain {
        check_domain(d)?;
    }
    for component in path.split('/') {
        check_path_component(component)?;
    }
    Ok(())
}

/// Whether the first part of a name is a registry host, as Docker reads it.
fn is_domain(first: &str) -> bool {
    first.contains(['.', ':'])
        || first == "localhost"
        || first.chars().any(|c| c.is_ascii_uppercase())
}

/// `domain := host [":" port]`.
fn check_domain(d: &str) -> Result<(), BadReference> {
    let bad = |why: &str| {
        BadReference::new(
            format!("the image's registry '{d}' is not valid: {why}"),
            "write the registry as host[:port], e.g. registry.example.com:5000/team/app:1.0",
        )
    };
    let (host, port) = if let Some(v6) = d.strip_prefix('[') {
        let Some((addr, after)) = v6.split_once(']') else {
            return Err(bad("an IPv6 address needs its closing ']'"));
        };
        if addr.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(bad("the address in [...] is not an IPv6 address"));
        }
        match after {
            "" => return Ok(()),
            p => match p.strip_prefix(':') {
                Some(port) => (None, Some(port)),
                None => return Err(bad("only :port may follow the IPv6 address")),
            },
        }
    } else {
        match d.split_once(':') {
            Some((h, p)) => (Some(h), Some(p)),
            None => (Some(d), None),
        }
    };
    if let Some(p) = port {
        if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad("the port after ':' must be digits"));
        }
    }
    if let Some(h) = host {
        let component_ok = |c: &str| {
            !c.is_empty()
                && c.chars().all(|ch| ch.is_ascii_alphanumeric() || ch == '-')
                && !c.starts_with('-')
                && !c.ends_with('-')
        };
        if !h.split('.').all(component_ok) {
            return Err(bad(
                "a host has letters, digits and '-' between dots, and no part starts or ends with '-'",
            ));
        }
    }
    Ok(())
}

/// `path-component := [a-z0-9]+ (separator [a-z0-9]+)*`, `separator := "." | "_" | "__" | "-"+`.
fn check_path_component(c: &str) -> Result<(), BadReference> {
    if c.chars().any(|ch| ch.is_ascii_uppercase()) {
        let lower = c.to_ascii_lowercase();
        return Err(BadReference::new(
            format!("the image's repository name must be lowercase: '{c}' has upper case"),
            format!("write '{lower}' (only the tag may have upper case)"),
        ));
    }
    if c.is_empty() {
        return Err(BadReference::new(
            "the image's repository name has an empty part (a '/' at the start or end, or '//')",
            "remove the extra '/'",
        ));
    }
    if let Some(ch) = c.chars().find(|ch| {
        !(ch.is_ascii_lowercase() || ch.is_ascii_digit() || matches!(ch, '.' | '_' | '-'))
    }) {
        return Err(BadReference::new(
            format!("the image's repository name '{c}' has '{ch}', which Docker does not allow"),
            "a repository name has lowercase letters, digits and the separators '.', '_', '__' and '-'",
        ));
    }
    let bytes = c.as_bytes();
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let mut i = 0;
    let mut ok = bytes.first().copied().is_some_and(alnum);
    while ok && i < bytes.len() {
        if alnum(bytes[i]) {
            i += 1;
            continue;
        }
        // A separator run: '.', '_', '__' or one or more '-', then an alphanumeric.
        let start = i;
        while i < bytes.len() && !alnum(bytes[i]) {
            i += 1;
        }
        let sep = &c[start..i];
        let sep_ok = matches!(sep, "." | "_" | "__") || sep.bytes().all(|b| b == b'-');
        ok = sep_ok && i < bytes.len();
    }
    if !ok {
        return Err(BadReference::new(
            format!("the image's repository name '{c}' is not valid: each part starts and ends with a letter or digit, joined by '.', '_', '__' or '-'"),
            "fix the name, e.g. image: my-org/my_app",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_reference;

    #[test]
    fn references_docker_accepts_pass() {
        for r in [
            "nginx",
            "nginx:1.27",
            "nginx:Latest_1.x-rc",
            "library/nginx",
            "ghcr.io/acme/web:1.2",
            "localhost/app",
            "localhost:5000/team/app:v1",
            "registry.example.com:5000/a/b/c:tag",
            "[::1]:5000/app",
            "my_org/my__app",
            "a--b/c.d",
            "Registry.Example.com/app",
            "nginx@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "nginx:1.27@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        ] {
            assert_eq!(check_reference(r), Ok(()), "{r}");
        }
    }

    #[test]
    fn references_docker_refuses_fail_with_the_rule() {
        for (r, want) in [
            ("nginx:", "tag is empty"),
            (":1.27", "no repository name"),
            ("Nginx:latest", "must be lowercase"),
            ("acme/Web", "must be lowercase"),
            ("nginx:-x", "tag '-x' is not valid"),
            ("nginx:a/b", "registry"),
            ("ng!nx", "has '!'"),
            ("-nginx", "each part starts and ends"),
            ("nginx-", "each part starts and ends"),
            ("a...b", "each part starts and ends"),
            ("a___b", "each part starts and ends"),
            ("acme//web", "empty part"),
            ("nginx@sha256:xyz", "digest"),
            ("nginx@sha256", "digest"),
            ("nginx@1sha:0123456789abcdef0123456789abcdef", "digest"),
            ("bad_host.com:port/app", "registry"),
            ("-x.io/app", "registry"),
            ("app:{{.Version}}", "template"),
            ("nginx 1.27", "whitespace"),
        ] {
            let e = check_reference(r).expect_err(r);
            assert!(e.message.contains(want), "{r}: {}", e.message);
        }
    }
}
