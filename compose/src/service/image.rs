//! What the container runs: `image` (with `build`, which is not supported yet), `command`,
//! `entrypoint` and `pull_policy`.

use ployz_core::PullPolicy;

use super::shapes::{command, text};
use super::{Node, Parts, ServiceCtx};

/// Reads one of `image`, `build`, `command`, `entrypoint` or `pull_policy`.
pub(super) fn read(ctx: &mut ServiceCtx<'_>, p: &mut Parts<'_>, k: &str, value: &Node) {
    match k {
        "image" => {
            if let Some(t) = ctx.get(k, value, text) {
                if t.trim().is_empty() {
                    ctx.err(
                        k,
                        Some(t),
                        "the image must not be empty",
                        Some("name an image, e.g. image: nginx:1.27"),
                    );
                } else if t.chars().any(char::is_whitespace) {
                    ctx.err(k, Some(t), "an image reference has no whitespace", None);
                } else {
                    p.image = Some(t);
                }
            }
        }
        "build" => p.build = !matches!(value, Node::Null),
        "command" if !matches!(value, Node::Null) => {
            p.container.command = ctx.get(k, value, command);
        }
        "entrypoint" if !matches!(value, Node::Null) => {
            p.container.entrypoint = ctx.get(k, value, command);
        }
        "pull_policy" => {
            if let Some(policy) = ctx.get(k, value, text) {
                p.container.pull_policy = pull_policy(ctx, k, policy);
            }
        }
        // A null command or entrypoint keeps the image's.
        _ => {}
    }
}

/// `always`, `missing` (or `if_not_present`) or `never`; `build` and anything else are errors.
fn pull_policy(ctx: &mut ServiceCtx<'_>, k: &str, p: String) -> PullPolicy {
    match p.as_str() {
        "always" => PullPolicy::Always,
        "missing" | "if_not_present" => PullPolicy::Missing,
        "never" => PullPolicy::Never,
        "build" => {
            ctx.err(
                k,
                Some(p),
                "pull_policy build needs build:, which is not supported yet",
                Some("build and tag the image locally, then use image: with pull_policy missing or never"),
            );
            PullPolicy::Missing
        }
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

/// A service needs an image; `build:` is not supported yet (an error without an image, a
/// warning with one). Returns the image, empty when there is none (an error was recorded).
pub(super) fn check_image(ctx: &mut ServiceCtx<'_>, image: Option<String>, build: bool) -> String {
    match (&image, build) {
        (None, true) => ctx.err(
            "build",
            None,
            "build is not supported yet",
            Some("build and tag the image locally, then use image:"),
        ),
        (None, false) => ctx.err(
            "image",
            None,
            "the service has no image",
            Some("add image:, e.g. image: nginx:1.27"),
        ),
        (Some(i), true) => ctx.warn(
            "build",
            format!("build is not supported yet and is ignored; the image '{i}' is used as it is"),
        ),
        (Some(_), false) => {}
    }
    image.unwrap_or_default()
}
