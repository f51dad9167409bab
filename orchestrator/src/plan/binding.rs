//! The plan id: what binds a Deploy Preview to the Deploy that runs it.
//!
//! A plan is never kept. What a reviewer saw is bound instead by the facts the plan was made
//! from, in five parts, each hashed on its own:
//!
//! - `intent`: every Requested Service Spec, the Service Attempts and the volumes asked for;
//! - `containers`: per Machine, the containers of the attempted Services (name, ID, the digest of
//!   their Resolved Service Spec, state, drain mark);
//! - `volumes`: per Machine, the Docker Volumes the Deploy Intent names;
//! - `images`: per Machine where an attempted Service may run, how each image resolves: by
//!   digest (`name@sha256:...`), by the image ID the Machine holds under a mutable tag, by its
//!   build (a Build Tag is derived from the build's inputs, which `intent` binds), or unresolved
//!   (a tag the Machine does not hold, which a registry may serve as anything);
//! - `machines`: the Machines included, and those left out.
//!
//! The id is `p1.` and the five parts' hashes (8 hex digits each, in that order), so a Deploy
//! bound to an id can say which part moved without the reviewed plan being stored anywhere.
//! The same facts seed the planner's tiebreak, so the same facts plan the same operations.

use std::collections::BTreeSet;
use std::fmt;

use ployz_core::{DeployIntent, MachineSnapshot, NotIncluded};

/// The five parts of a binding, in the id's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Part {
    Intent,
    Containers,
    Volumes,
    Images,
    Machines,
}

impl Part {
    pub const ALL: [Part; 5] = [
        Part::Intent,
        Part::Containers,
        Part::Volumes,
        Part::Images,
        Part::Machines,
    ];

    /// What moved, said to the user when this part differs.
    pub fn moved(self) -> &'static str {
        match self {
            Part::Intent => {
                "the Deploy Intent: a Requested Service Spec (the Compose files, their variables or a build's inputs), the Services attempted or the volumes asked for"
            }
            Part::Containers => {
                "the containers of the attempted Services: one was created, replaced, removed, stopped or started, or a drain mark changed"
            }
            Part::Volumes => "the Docker Volumes the Deploy Intent names",
            Part::Images => {
                "how an image resolves on a Machine: a tag now names another image, or an image was pulled or removed"
            }
            Part::Machines => "the Machines included: one answers now that did not, or no longer answers",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Part::Intent => "intent",
            Part::Containers => "containers",
            Part::Volumes => "volumes",
            Part::Images => "images",
            Part::Machines => "machines",
        }
    }
}

/// A plan id: `p1.` and five 8-digit hashes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanId([u32; 5]);

impl PlanId {
    /// The parts that differ between this id and `other`.
    pub fn moved(&self, other: &PlanId) -> Vec<Part> {
        Part::ALL
            .into_iter()
            .zip(self.0.iter().zip(other.0.iter()))
            .filter(|(_, (a, b))| a != b)
            .map(|(part, _)| part)
            .collect()
    }
}

impl fmt::Display for PlanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "p1")?;
        for part in self.0 {
            write!(f, ".{part:08x}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for PlanId {
    type Err = String;

    fn from_str(s: &str) -> Result<PlanId, String> {
        let bad = || {
            format!(
                "'{s}' is not a plan id: it looks like p1.0a1b2c3d.4e5f6a7b.8c9d0e1f.2a3b4c5d.6e7f8a9b, as `ployz deploy --dry-run` prints it"
            )
        };
        let mut pieces = s.trim().split('.');
        if pieces.next() != Some("p1") {
            return Err(bad());
        }
        let mut parts = [0u32; 5];
        for slot in &mut parts {
            let piece = pieces.next().ok_or_else(bad)?;
            if piece.len() != 8 {
                return Err(bad());
            }
            *slot = u32::from_str_radix(piece, 16).map_err(|_| bad())?;
        }
        if pieces.next().is_some() {
            return Err(bad());
        }
        Ok(PlanId(parts))
    }
}

/// The facts a plan is made from, part by part, as lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanBinding {
    facts: [Vec<String>; 5],
    /// Images that resolve by a tag a Machine does not hold: `image on Machine`.
    unresolved: Vec<String>,
}

impl PlanBinding {
    /// The binding of planning `intent` against `machines` (the Deploy Snapshot), with the
    /// Machines it leaves out and the images the CLI builds (their Build Tags).
    pub fn of(
        intent: &DeployIntent,
        machines: &[MachineSnapshot],
        not_included: &[NotIncluded],
        built: &[String],
    ) -> PlanBinding {
        let attempted: BTreeSet<&str> = intent.attempts.iter().map(|a| a.as_str()).collect();
        let mut facts: [Vec<String>; 5] = Default::default();

        let intent_facts = &mut facts[0];
        for spec in &intent.services {
            intent_facts.push(format!("service {} {}", spec.name, digest_json(spec)));
        }
        let mut attempts: Vec<&str> = attempted.iter().copied().collect();
        attempts.sort_unstable();
        intent_facts.push(format!("attempts {}", attempts.join(",")));
        for volume in &intent.volumes {
            intent_facts.push(format!("volume {} {}", volume.name, digest_json(volume)));
        }

        let volume_names: BTreeSet<&str> = intent.volumes.iter().map(|v| v.name.as_str()).collect();
        let mut unresolved = Vec::new();
        for m in machines {
            let id = &m.machine.info.id;
            let name = &m.machine.info.name;
            for c in &m.containers {
                if !attempted.contains(c.service_name.as_str()) {
                    continue;
                }
                let drained = m.drains.iter().any(|d| d.container_id == c.id);
                // Left by an interrupted command, it is kept only once it serves.
                let left = c
                    .lease_token
                    .filter(|t| m.interrupted.iter().any(|l| l.token == *t))
                    .map_or(String::new(), |t| {
                        format!(" left by lease {t} serving {}", c.is_serving())
                    });
                facts[1].push(format!(
                    "{id} container {} {} of {} {} spec {}{}{left}",
                    c.name,
                    c.id,
                    c.service_name,
                    serde_json::to_string(&c.state).unwrap_or_default(),
                    c.spec.as_ref().map_or("-".to_owned(), digest_json),
                    if drained { " drained" } else { "" }
                ));
            }
            for v in &m.volumes {
                if volume_names.contains(v.name.as_str()) {
                    facts[2].push(format!("{id} volume {} {}", v.name, v.driver));
                }
            }
            for spec in intent
                .services
                .iter()
                .filter(|s| attempted.contains(s.name.as_str()))
            {
                let image = spec.container.image.as_str();
                let resolved = if image.contains("@sha256:") {
                    "by digest".to_owned()
                } else if built.iter().any(|b| b == image) {
                    "by its build".to_owned()
                } else if let Some(image_id) = m.image_ids.get(&qualified(image)) {
                    format!("as {image_id}")
                } else if m.images.iter().any(|i| *i == qualified(image)) {
                    // An older daemon lists tags without their IDs.
                    "by tag (held)".to_owned()
                } else {
                    unresolved.push(format!("{image} on {name}"));
                    "unresolved".to_owned()
                };
                facts[3].push(format!("{id} image {image} {resolved}"));
            }
        }
        for m in machines {
            facts[4].push(format!("included {}", m.machine.info.id));
        }
        for n in not_included {
            facts[4].push(format!("left out {}", n.machine));
        }
        for part in &mut facts {
            part.sort();
            part.dedup();
        }
        unresolved.sort();
        unresolved.dedup();
        PlanBinding { facts, unresolved }
    }

    /// The plan id.
    pub fn id(&self) -> PlanId {
        let mut parts = [0u32; 5];
        for (slot, (part, lines)) in parts.iter_mut().zip(Part::ALL.iter().zip(&self.facts)) {
            let digest = sha256_lines(part.name(), lines);
            *slot = u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]);
        }
        PlanId(parts)
    }

    /// The planner's seed for these facts: the same facts, the same tiebreaks.
    pub fn seed(&self) -> u64 {
        let mut all = Vec::new();
        for (part, lines) in Part::ALL.iter().zip(&self.facts) {
            all.extend_from_slice(&sha256_lines(part.name(), lines));
        }
        let digest = ring::digest::digest(&ring::digest::SHA256, &all);
        let mut seed = [0u8; 8];
        seed.copy_from_slice(&digest.as_ref()[..8]);
        u64::from_be_bytes(seed)
    }

    /// Images a Machine would resolve by a tag it does not hold (`image on Machine`): what a
    /// plan id cannot bind.
    pub fn unresolved(&self) -> &[String] {
        &self.unresolved
    }

    /// The facts of one part, as lines (what `--plan-id` shows of a part that moved).
    pub fn facts(&self, part: Part) -> &[String] {
        &self.facts[part as usize]
    }
}

/// `nginx` is `nginx:latest` in Docker's list of tags; a reference with a tag or digest is as
/// written.
fn qualified(image: &str) -> String {
    let last = image.rsplit('/').next().unwrap_or(image);
    if last.contains(':') || image.contains('@') {
        image.to_owned()
    } else {
        format!("{image}:latest")
    }
}

/// A Resolved Service Spec's digest as `ployz history` shows it, secrets counted by their
/// digests only (as a container's label holds them).
pub fn spec_digest(spec: &ployz_core::ServiceSpec) -> String {
    let mut spec = spec.clone();
    spec.strip_secret_values();
    digest_json(&spec)
}

fn digest_json(value: &impl serde::Serialize) -> String {
    let json = serde_json::to_vec(value).unwrap_or_default();
    let digest = ring::digest::digest(&ring::digest::SHA256, &json);
    hex::encode(&digest.as_ref()[..12])
}

fn sha256_lines(name: &str, lines: &[String]) -> [u8; 32] {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(name.as_bytes());
    for line in lines {
        ctx.update(b"\n");
        ctx.update(line.as_bytes());
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    out
}
