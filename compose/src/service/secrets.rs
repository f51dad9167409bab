//! The service's `secrets:` entries: short syntax (`- db_password`, mounted at
//! `/run/secrets/db_password`) and long syntax (`source`, `target`, `uid`, `gid`, `mode`; a
//! relative target lands under `/run/secrets/`). The project resolves each against the
//! top-level `secrets:` and reads its value; the container gets it as a read-only file.

use super::configs::{file_uses, FileKind};
use super::{ConfigUse, Node, ServiceCtx};

/// `secrets:`: a list of names or `source:`/`target:` entries.
pub(super) fn service_secrets(ctx: &mut ServiceCtx<'_>, n: &Node) -> Vec<ConfigUse> {
    file_uses(ctx, n, FileKind::Secret)
}
