//! `ployz image`: the images on the Machines, and images sent to them from the Docker where the
//! CLI runs, without a registry. A push offers the image to each Machine first: a Machine that
//! has it (by ID) costs that one round trip; any other names the layers it lacks, and only
//! those cross, compressed, streamed through the Machine reached and the mesh, and checked on
//! arrival (the image that loaded has the ID offered).

use std::io::IsTerminal as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _};
use clap::{Args, Subcommand};
use ployz_core::api::{
    self, docker_paths as paths, ImageOffer, ImageSummary, LoadedImage, MachineList, OfferAnswer,
    RemovedImage,
};
use ployz_core::{MachineId, TargetFailure};
use ployz_orchestrator::images::{self, TransferCounters};
use serde::Serialize;

use crate::output::{bytes, print_json, print_table, table};
use crate::GlobalArgs;

#[derive(Debug, Subcommand)]
pub enum ImageCommand {
    /// Send images from the local Docker (DOCKER_HOST, else /var/run/docker.sock) to Machines:
    /// only the layers each Machine lacks cross the network.
    Push(PushArgs),
    /// List the images on the Machines.
    #[command(visible_alias = "list")]
    Ls(LsArgs),
    /// Remove images from the Machines that have them.
    #[command(visible_alias = "remove")]
    Rm(RmArgs),
}

#[derive(Debug, Args)]
pub struct PushArgs {
    /// Images of the local Docker: `app:1.2`, `app` (`app:latest`) or an image ID (not a
    /// registry digest, `app@sha256:...`: a Machine can be given no digest).
    #[arg(required = true, value_name = "IMAGE")]
    images: Vec<String>,
    /// Print JSON: per image, `values` (each Machine's outcome) and `failures`.
    #[arg(long)]
    json: bool,
    /// The Machines to send to (repeatable) [default: every Machine].
    #[command(flatten)]
    machines: crate::targets::MachinesArg,
}

#[derive(Debug, Args)]
pub struct LsArgs {
    /// Only images with this tag, name or ID (prefix).
    #[arg(value_name = "IMAGE")]
    image: Option<String>,
    /// Print JSON: `values` (each image with its `machine` and `machine_name`) and `failures`.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    machines: crate::targets::MachinesArg,
}

#[derive(Debug, Args)]
pub struct RmArgs {
    /// Tags, names or IDs.
    #[arg(required = true, value_name = "IMAGE")]
    images: Vec<String>,
    /// Remove it from under stopped containers too, and an ID with several tags.
    #[arg(short, long)]
    force: bool,
    /// Remove it from these Machines only (repeatable) [default: every Machine that has it].
    #[command(flatten)]
    machines: crate::targets::MachinesArg,
}

pub async fn run(global: &GlobalArgs, cmd: ImageCommand) -> anyhow::Result<()> {
    match cmd {
        ImageCommand::Push(args) => push(global, args).await,
        ImageCommand::Ls(args) => ls(global, args).await,
        ImageCommand::Rm(args) => rm(global, args).await,
    }
}

/// The Docker where the CLI runs, and where that is, as messages name it.
pub async fn local_docker() -> anyhow::Result<(bollard::Docker, String)> {
    let shown = std::env::var("DOCKER_HOST")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unix:///var/run/docker.sock".to_owned());
    let fix =
        "images are sent from the Docker where the CLI runs: start it, or point DOCKER_HOST at one";
    let docker = bollard::Docker::connect_with_local_defaults()
        .map_err(|e| anyhow!("cannot reach the local Docker at {shown}: {e}; {fix}"))?
        .with_timeout(Duration::from_secs(30));
    let docker = docker
        .negotiate_version()
        .await
        .map_err(|e| anyhow!("cannot reach the local Docker at {shown}: {e}; {fix}"))?;
    Ok((docker, shown))
}

/// The Machines `wanted` names (Names or IDs; none or `*`: every Machine), as (ID, Name).
pub async fn machines(
    client: &mut crate::client::ApiClient,
    wanted: &[String],
) -> anyhow::Result<Vec<(MachineId, String)>> {
    let list: MachineList = client.get(api::paths::MACHINES).await?;
    if list.values.is_empty() {
        bail!("the Machine reached is not initialised, so there is no Machine to send to; run `ployz machine init` first");
    }
    if wanted.is_empty() || wanted.iter().any(|w| w == "*") {
        if wanted.len() > 1 {
            bail!("-m '*' already names every Machine; give it alone");
        }
        return Ok(list
            .values
            .iter()
            .map(|v| (v.info.id.clone(), v.info.name.to_string()))
            .collect());
    }
    let mut out: Vec<(MachineId, String)> = Vec::new();
    for w in wanted {
        let found = crate::commands::machine::resolve(&list, w)?;
        if !out.iter().any(|(id, _)| *id == found.info.id) {
            out.push((found.info.id.clone(), found.info.name.to_string()));
        }
    }
    Ok(out)
}

/// Where one Machine's share of a push is.
#[derive(Debug, Clone)]
enum Phase {
    Offering,
    Sending { missing: usize, since: Instant },
    Loading { since: Instant },
    Done(PushOutcome),
    Failed(String),
}

/// What a push did on one Machine.
#[derive(Debug, Clone, Serialize)]
pub struct PushOutcome {
    pub machine: MachineId,
    pub machine_name: String,
    /// The Machine had the image already: nothing was sent.
    pub present: bool,
    pub layers_sent: usize,
    pub layers: usize,
    /// Bytes that crossed the network (compressed).
    pub bytes_sent: u64,
    /// The same before compression.
    pub archive_bytes: u64,
    pub seconds: f64,
}

/// One Machine's share, watched by the progress display.
pub struct Share {
    name: String,
    counters: Arc<TransferCounters>,
    phase: Mutex<Phase>,
    layers: usize,
}

impl Share {
    pub fn new(name: &str, layers: usize) -> Arc<Share> {
        Arc::new(Share {
            name: name.to_owned(),
            counters: Arc::new(TransferCounters::default()),
            phase: Mutex::new(Phase::Offering),
            layers,
        })
    }

    fn set(&self, phase: Phase) {
        *self.phase.lock().expect("phase lock") = phase;
    }

    fn phase(&self) -> Phase {
        self.phase.lock().expect("phase lock").clone()
    }

    /// One line: where it is, bytes, rate, layers.
    fn line(&self) -> String {
        let sent = self.counters.wire();
        let rate = |since: Instant| {
            let s = since.elapsed().as_secs_f64().max(0.001);
            format!("{}/s", bytes((sent as f64 / s) as u64))
        };
        let passed = self.counters.layers_sent() + self.counters.layers_skipped();
        match self.phase() {
            Phase::Offering => format!("{}: offering", self.name),
            Phase::Sending { missing, since } => format!(
                "{}: sending {missing} of {} layers  {}  {}  layer {}/{}",
                self.name,
                self.layers,
                bytes(sent),
                rate(since),
                passed.min(self.layers),
                self.layers
            ),
            Phase::Loading { since } => format!(
                "{}: loading ({} sent in {:.1} s)",
                self.name,
                bytes(sent),
                since.elapsed().as_secs_f64()
            ),
            Phase::Done(o) if o.present => format!("{}: has it already", self.name),
            Phase::Done(o) => format!(
                "{}: done, {} of {} layers, {} in {:.1} s",
                self.name,
                o.layers_sent,
                o.layers,
                bytes(o.bytes_sent),
                o.seconds
            ),
            Phase::Failed(why) => format!("{}: failed: {why}", self.name),
        }
    }
}

/// Shows the shares as they go: on a terminal, a line per Machine redrawn in place; otherwise
/// a line each time a Machine's share moves to another phase.
async fn show_progress(shares: Arc<Vec<Arc<Share>>>, done: tokio::sync::watch::Receiver<bool>) {
    let terminal = std::io::stderr().is_terminal();
    let mut done = done;
    let mut last: Vec<String> = vec![String::new(); shares.len()];
    let mut drawn = 0;
    loop {
        let finished = *done.borrow();
        if terminal {
            let mut out = String::new();
            if drawn > 0 {
                out.push_str(&format!("\x1b[{drawn}A"));
            }
            for s in shares.iter() {
                out.push_str("\x1b[2K");
                out.push_str(&s.line());
                out.push('\n');
            }
            drawn = shares.len();
            eprint!("{out}");
        } else {
            for (i, s) in shares.iter().enumerate() {
                let key = match s.phase() {
                    Phase::Sending { .. } => "sending".to_owned(),
                    other => format!("{other:?}"),
                };
                if key != last[i] {
                    last[i] = key;
                    eprintln!("{}", s.line());
                }
            }
        }
        if finished {
            return;
        }
        tokio::select! {
            _ = done.changed() => {}
            _ = tokio::time::sleep(Duration::from_millis(if terminal { 200 } else { 100 })) => {}
        }
    }
}

/// How many Machines a push sends to at once: each send is its own `docker save` (which, on the
/// classic image store, lays the whole image out on the local disk first) and its own
/// compressing thread.
const SENDS_AT_ONCE: usize = 2;

/// Sends image `offer` from `local` to each of `targets`, [`SENDS_AT_ONCE`] at a time (a
/// connection each), showing
/// progress unless `quiet`: each Machine's outcome, and the Machines that failed (a Partial
/// Result).
pub async fn push_image(
    global: &GlobalArgs,
    local: &bollard::Docker,
    offer: &ImageOffer,
    targets: &[(MachineId, String)],
    quiet: bool,
) -> (Vec<PushOutcome>, Vec<TargetFailure>) {
    let shares: Arc<Vec<Arc<Share>>> = Arc::new(
        targets
            .iter()
            .map(|(_, name)| Share::new(name, offer.layers.len()))
            .collect(),
    );
    let (finished, done) = tokio::sync::watch::channel(false);
    let display = (!quiet).then(|| tokio::spawn(show_progress(shares.clone(), done)));
    let pushes = targets
        .iter()
        .zip(shares.iter())
        .map(|((id, name), share)| {
            let share = share.clone();
            async move {
                let outcome = async {
                    let mut client = super::connect(global).await?;
                    send_to(&mut client, local, offer, id, name, share.clone()).await
                }
                .await;
                match &outcome {
                    Ok(o) => share.set(Phase::Done(o.clone())),
                    Err(e) => share.set(Phase::Failed(format!("{e:#}"))),
                }
                (id.clone(), outcome)
            }
        });
    let results: Vec<_> = {
        use futures_util::StreamExt as _;
        futures_util::stream::iter(pushes)
            .buffer_unordered(SENDS_AT_ONCE)
            .collect()
            .await
    };
    let _ = finished.send(true);
    if let Some(display) = display {
        let _ = display.await;
    }
    let mut values = Vec::new();
    let mut failures = Vec::new();
    for (id, result) in results {
        match result {
            Ok(o) => values.push(o),
            Err(e) => failures.push(TargetFailure {
                target: id.to_string(),
                reason: format!("{e:#}"),
            }),
        }
    }
    (values, failures)
}

/// Sends image `offer` from `local` to Machine `id` through `client`: the offer, then (unless
/// the Machine has it) the layers it lacks.
pub async fn send_to(
    client: &mut crate::client::ApiClient,
    local: &bollard::Docker,
    offer: &ImageOffer,
    id: &MachineId,
    name: &str,
    share: Arc<Share>,
) -> anyhow::Result<PushOutcome> {
    client.set_machine_target(Some(id.to_string()));
    let sent = send_aimed(client, local, offer, id, name, share).await;
    client.set_machine_target(None);
    sent
}

async fn send_aimed(
    client: &mut crate::client::ApiClient,
    local: &bollard::Docker,
    offer: &ImageOffer,
    id: &MachineId,
    name: &str,
    share: Arc<Share>,
) -> anyhow::Result<PushOutcome> {
    let started = Instant::now();
    let answer: OfferAnswer = client.post(paths::IMAGE_OFFERS, offer).await?;
    let mut outcome = PushOutcome {
        machine: id.clone(),
        machine_name: name.to_owned(),
        present: answer.present,
        layers_sent: 0,
        layers: offer.layers.len(),
        bytes_sent: 0,
        archive_bytes: 0,
        seconds: 0.0,
    };
    if !answer.present {
        share.set(Phase::Sending {
            missing: answer.missing.len(),
            since: Instant::now(),
        });
        let skip = images::skipped(offer, &answer.missing);
        let counters = share.counters.clone();
        let layers = offer.layers.iter().cloned().collect();
        let mut stream = Box::pin(images::export(
            local,
            &offer.id,
            skip,
            layers,
            counters.clone(),
        ));
        // The request goes once the first byte is there: Docker lays a large image out on its
        // disk before `docker save` writes anything, and the Machine would see an idle body.
        let first = {
            use futures_util::StreamExt as _;
            tokio::select! {
                first = stream.next() => first,
                stalled = stalled(&share, stall_limit()) => bail!(
                    "sending to Machine '{name}': {stalled}"
                ),
            }
        };
        let first = match first {
            Some(Ok(chunk)) => chunk,
            Some(Err(e)) => bail!("reading the image from the local Docker: {e}"),
            None => bail!("the local Docker's `docker save` of {} was empty", offer.id),
        };
        // Once the last byte is made, the Machine is loading the image.
        let on_end = share.clone();
        let watched = {
            use futures_util::StreamExt as _;
            futures_util::stream::once(futures_util::future::ready(Ok(first)))
                .chain(stream)
                .map(Some)
                .chain(futures_util::stream::once(async move {
                    on_end.set(Phase::Loading {
                        since: Instant::now(),
                    });
                    None
                }))
                .filter_map(futures_util::future::ready)
        };
        let path = format!(
            "{}?id={}&tags={}",
            paths::IMAGE_LOAD,
            api::query_value(&offer.id),
            api::query_value(&offer.tags.join(","))
        );
        let sending = client.post_stream::<_, LoadedImage>(&path, watched);
        let loaded: LoadedImage = tokio::select! {
            loaded = sending => loaded.with_context(|| format!("sending to Machine '{name}'"))?,
            stalled = stalled(&share, stall_limit()) => bail!(
                "sending to Machine '{name}': {stalled}"
            ),
        };
        if loaded.id != offer.id {
            bail!(
                "Machine '{name}' loaded {} where {} was sent",
                loaded.id,
                offer.id
            );
        }
        outcome.layers_sent = counters.layers_sent();
        outcome.bytes_sent = loaded.received;
        outcome.archive_bytes = counters.archive();
    }
    outcome.seconds = started.elapsed().as_secs_f64();
    Ok(outcome)
}

/// How long a transfer may go without progress (a byte read from `docker save` or sent) before
/// the push to it gives up: `PLOYZ_TRANSFER_STALL_SECONDS` (default 60); ten times that for
/// `docker save`'s first byte, and sixty times that for the Machine to load what it received.
fn stall_limit() -> Duration {
    let seconds = std::env::var("PLOYZ_TRANSFER_STALL_SECONDS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|s| *s > 0)
        .unwrap_or(60);
    Duration::from_secs(seconds)
}

/// Resolves when `share`'s transfer stalls: no progress (a byte read from `docker save`, or
/// sent) for `limit` while sending, `docker save` silent for `10 * limit` before its first
/// byte, or no answer `60 * limit` after the last byte. A cut link otherwise holds a push until
/// TCP gives up, many minutes later.
async fn stalled(share: &Share, limit: Duration) -> String {
    let progress = || (share.counters.read(), share.counters.wire());
    let mut last = (progress(), Instant::now());
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = progress();
        if now != last.0 {
            last = (now, Instant::now());
            continue;
        }
        let (read, sent) = now;
        match share.phase() {
            Phase::Loading { since } if since.elapsed() >= limit * 60 => {
                return format!(
                    "no answer {} s after the last byte",
                    since.elapsed().as_secs()
                )
            }
            Phase::Loading { .. } => {}
            _ if read == 0 && last.1.elapsed() >= limit * 10 => {
                return format!(
                    "the local Docker's `docker save` gave no byte in {} s",
                    last.1.elapsed().as_secs()
                )
            }
            _ if read > 0 && last.1.elapsed() >= limit => {
                return format!(
                    "no byte went out for {} s ({} sent); the link to it may be cut (`ployz machine ls` shows how the Machine reached observes it); the next push starts again from what it has",
                    limit.as_secs(),
                    bytes(sent)
                )
            }
            _ => {}
        }
    }
}

/// The offer of the local Docker's image `reference`, or a clear error.
pub async fn local_offer(
    local: &bollard::Docker,
    shown: &str,
    reference: &str,
) -> anyhow::Result<ImageOffer> {
    images::describe(local, shown, reference)
        .await
        .map_err(|e| anyhow!("{e}"))?
        .ok_or_else(|| {
            anyhow!("the local Docker ({shown}) has no image '{reference}'; build or pull it there first (`docker images` lists what it has)")
        })
}

fn short(id: &str) -> &str {
    let hex = id.strip_prefix("sha256:").unwrap_or(id);
    &hex[..hex.len().min(12)]
}

/// Refuses a reference by digest (`name@sha256:...`): Docker records a digest only for an image
/// it pulled from a registry, and what `docker load` brings in has none, so a Machine given the
/// image this way still could not find it by that reference (and would pull it).
fn check_pushable(reference: &str) -> anyhow::Result<()> {
    if let Some((name, _digest)) = reference.split_once('@') {
        bail!(
            "'{reference}' names the image by its registry digest, which a Machine cannot be given (Docker keeps a digest only for an image it pulled); push a tag or the image ID instead (`docker tag {reference} {name}:TAG`, then `ployz image push {name}:TAG`), and use that tag in the Compose file, or let each Machine pull it by digest"
        );
    }
    Ok(())
}

async fn push(global: &GlobalArgs, args: PushArgs) -> anyhow::Result<()> {
    for reference in &args.images {
        check_pushable(reference)?;
    }
    // Every image is found locally before any Machine is asked anything.
    let (local, shown) = local_docker().await?;
    let mut offers = Vec::new();
    for reference in &args.images {
        offers.push((reference, local_offer(&local, &shown, reference).await?));
    }
    let mut client = super::connect(global).await?;
    let targets = machines(&mut client, &args.machines.machines).await?;
    drop(client);
    let mut documents = Vec::new();
    let mut all_failures = Vec::new();
    for (reference, offer) in &offers {
        if !args.json {
            eprintln!(
                "Pushing {reference} ({}, {} layers) to {} Machine{}",
                short(&offer.id),
                offer.layers.len(),
                targets.len(),
                if targets.len() == 1 { "" } else { "s" }
            );
        }
        let (values, failures) = push_image(global, &local, offer, &targets, args.json).await;
        if args.json {
            documents.push(serde_json::json!({
                "image": reference,
                "id": offer.id,
                "values": values,
                "failures": failures,
            }));
        } else {
            let sent: u64 = values.iter().map(|v| v.bytes_sent).sum();
            let had = values.iter().filter(|v| v.present).count();
            println!(
                "{reference} ({}): {} of {} Machines have it ({had} already did); {} sent.",
                short(&offer.id),
                values.len(),
                targets.len(),
                bytes(sent)
            );
        }
        all_failures.extend(failures);
    }
    if args.json {
        print_json(&documents)?;
    }
    crate::targets::report_failures(&all_failures, targets.len())
}

/// `reference` as Docker lists its tags: Docker Hub's `docker.io/library/nginx`,
/// `docker.io/nginx` and `library/nginx` are `nginx`, `docker.io/user/app` is `user/app`.
fn familiar(reference: &str) -> &str {
    let rest = ["docker.io/", "index.docker.io/"]
        .iter()
        .find_map(|hub| reference.strip_prefix(hub))
        .unwrap_or(reference);
    rest.strip_prefix("library/").unwrap_or(rest)
}

/// Whether image `i` is the one `wanted` names: a tag (`app` meaning `app:latest`, Docker Hub's
/// long forms included), or an ID or its prefix.
fn names(i: &ImageSummary, wanted: &str) -> bool {
    let hex = wanted.strip_prefix("sha256:").unwrap_or(wanted);
    if hex.len() >= 4
        && hex.bytes().all(|b| b.is_ascii_hexdigit())
        && i.id.trim_start_matches("sha256:").starts_with(hex)
    {
        return true;
    }
    let wanted = familiar(wanted);
    let tagged = match wanted.rsplit_once(':') {
        Some((_, tag)) if !tag.contains('/') => wanted.to_owned(),
        _ => format!("{wanted}:latest"),
    };
    i.tags.contains(&tagged)
}

/// One row of `image ls --json`.
#[derive(Serialize)]
struct Listed<'a> {
    machine: &'a MachineId,
    machine_name: &'a str,
    #[serde(flatten)]
    image: &'a ImageSummary,
}

async fn ls(global: &GlobalArgs, args: LsArgs) -> anyhow::Result<()> {
    let mut client = super::connect(global).await?;
    let (answers, failures) = crate::targets::get_all::<Vec<ImageSummary>>(
        &mut client,
        &args.machines.machines,
        paths::IMAGES,
    )
    .await?;
    let asked = answers.len() + failures.len();
    let mut rows: Vec<Listed> = Vec::new();
    for (machine, images) in &answers {
        for image in images {
            if args.image.as_deref().is_none_or(|w| names(image, w)) {
                rows.push(Listed {
                    machine: &machine.machine,
                    machine_name: &machine.name,
                    image,
                });
            }
        }
    }
    if args.json {
        print_json(&serde_json::json!({ "values": rows, "failures": failures }))?;
        return crate::targets::report_failures(&failures, asked);
    }
    let mut t = table(&["MACHINE", "IMAGE", "ID", "SIZE", "CREATED"]);
    for r in &rows {
        let shown_tags = if r.image.tags.is_empty() {
            vec!["<none>".to_owned()]
        } else {
            r.image.tags.clone()
        };
        for tag in shown_tags {
            t.add_row(vec![
                r.machine_name.to_owned(),
                tag,
                short(&r.image.id).to_owned(),
                bytes(r.image.size),
                r.image.created.clone().unwrap_or_default(),
            ]);
        }
    }
    print_table(&t);
    crate::targets::report_failures(&failures, asked)
}

async fn rm(global: &GlobalArgs, args: RmArgs) -> anyhow::Result<()> {
    for image in &args.images {
        ployz_orchestrator::docker::check_image_reference(image).map_err(|e| anyhow!("{e}"))?;
    }
    let mut client = super::connect(global).await?;
    let (answers, mut failures) = crate::targets::get_all::<Vec<ImageSummary>>(
        &mut client,
        &args.machines.machines,
        paths::IMAGES,
    )
    .await?;
    let asked = answers.len() + failures.len();
    let answered = failures.is_empty();
    // An image no Machine has is reported after the others are removed, not instead.
    let mut missing = Vec::new();
    for wanted in &args.images {
        let holders: Vec<(&MachineId, &str)> = answers
            .iter()
            .filter(|(_, images)| images.iter().any(|i| names(i, wanted)))
            .map(|(m, _)| (&m.machine, m.name.as_str()))
            .collect();
        if holders.is_empty() {
            missing.push(format!("'{wanted}'"));
            continue;
        }
        for (id, name) in holders {
            client.set_machine_target(Some(id.to_string()));
            let path = format!(
                "{}?reference={}&force={}",
                paths::IMAGES,
                api::query_value(wanted),
                args.force
            );
            let removed: anyhow::Result<RemovedImage> = client.delete_value(&path).await;
            client.set_machine_target(None);
            match removed {
                Ok(r) => println!(
                    "Image '{wanted}' removed from Machine {name} ({} untagged, {} deleted).",
                    r.untagged.len(),
                    r.deleted.len()
                ),
                Err(e) => failures.push(TargetFailure {
                    target: id.to_string(),
                    reason: format!("{e:#}"),
                }),
            }
        }
    }
    let partial = crate::targets::report_failures(&failures, asked);
    if !missing.is_empty() {
        bail!(
            "no image {} on the Machines {}; `ployz image ls` lists them",
            missing.join(", "),
            if answered { "asked" } else { "that answered" }
        );
    }
    partial
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_digest_reference_is_refused_and_tags_and_ids_are_not() {
        let digest = format!("nginx@sha256:{}", "a".repeat(64));
        let e = super::check_pushable(&digest).unwrap_err().to_string();
        assert!(
            e.contains(&digest) && e.contains("docker tag") && e.contains("nginx:TAG"),
            "{e}"
        );
        for fine in [
            "nginx",
            "nginx:1.27",
            "registry:5000/app:2",
            "sha256:0123abcd",
            "0123abcd",
        ] {
            assert!(super::check_pushable(fine).is_ok(), "{fine}");
        }
    }

    use super::*;

    fn image(id_hex: &str, tags: &[&str]) -> ImageSummary {
        ImageSummary {
            id: format!("sha256:{id_hex}"),
            tags: tags.iter().map(|t| t.to_string()).collect(),
            size: 0,
            created: None,
            containers: None,
        }
    }

    #[test]
    fn an_image_is_named_by_tag_or_id_prefix() {
        let i = image(&"ab12".repeat(16), &["app:1", "app:latest", "reg:5000/x:2"]);
        for yes in ["app:1", "app", "reg:5000/x:2", "ab12ab", "sha256:ab12ab12"] {
            assert!(names(&i, yes), "{yes}");
        }
        for no in ["app:2", "reg:5000/x", "ab13", "abc", "x"] {
            assert!(!names(&i, no), "{no}");
        }
        // Docker lists Docker Hub's images by their familiar names.
        let hub = image(&"cd34".repeat(16), &["nginx:1.27", "user/app:2"]);
        for yes in [
            "docker.io/library/nginx:1.27",
            "docker.io/nginx:1.27",
            "library/nginx:1.27",
            "index.docker.io/library/nginx:1.27",
            "docker.io/user/app:2",
        ] {
            assert!(names(&hub, yes), "{yes}");
        }
        for no in [
            "docker.io/library/nginx",
            "quay.io/nginx:1.27",
            "docker.io/app:2",
        ] {
            assert!(!names(&hub, no), "{no}");
        }
    }
}
