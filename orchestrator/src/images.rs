//! Images from one Docker to another without a registry: only the layers the receiving side
//! lacks cross the network.
//!
//! The sender describes the image ([`describe`]: its ID, its layers' diff IDs, its tags) and
//! offers it ([`offer`] on the receiving side): the receiver either has the image by ID (one
//! round trip; the offered tags are applied) or names the layers it lacks, judged by chain ID
//! as Docker's own loader judges them. The sender then streams [`export`]: `docker save`'s
//! archive with every other layer left out, compressed with zstd, never held whole in memory.
//! The receiver feeds it to `docker load` ([`load`]), which skips the layers it has and checks
//! each one it reads against its diff ID, then checks the image that arrived has the offered
//! ID. Docker unpacks the whole archive before it registers anything, so a transfer cut off
//! half way leaves no half image, and the next offer starts over from what is there.

use std::collections::HashSet;
use std::io::{self, Read, Seek, Write};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bollard::query_parameters::{
    ImportImageOptions, ListImagesOptions, RemoveImageOptions, TagImageOptions,
};
pub use bollard::Docker;
use bytes::Bytes;
use futures_util::{Stream, StreamExt, TryStreamExt};
use ployz_core::api::{ImageOffer, ImageSummary, LoadedImage, OfferAnswer, RemovedImage};

use crate::docker::{check_image_reference, DockerError};

/// The zstd level on the wire: fast enough to keep up with a gigabit link on one core, and
/// most of what a higher level would save on layers of binaries and text.
const ZSTD_LEVEL: i32 = 3;
/// Chunks between the thread that writes the archive and the connection that sends it.
const CHUNK: usize = 256 * 1024;
const CHANNEL_CHUNKS: usize = 8;
/// How long one request to Docker that moves a whole image (`docker save`, `docker load`) may
/// take, the image's bytes included: a bound for a request that hangs, not a pace; the pace is
/// kept by [`KEEPALIVE`] and the idle bounds of whoever receives the bytes.
pub const LOAD_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
/// While the sender reads what it does not send (a layer the receiver has, a layer being hashed)
/// nothing would cross for as long as that takes: every this often it ends the zstd frame under
/// way and sends an empty skippable frame, which decoders pass over, so the receiver's idle
/// bound measures a link, not a disk.
pub const KEEPALIVE: Duration = Duration::from_secs(5);
/// A zstd skippable frame of no content (magic `0x184D2A50`, size 0).
const SKIPPABLE: [u8; 8] = [0x50, 0x2A, 0x4D, 0x18, 0, 0, 0, 0];

/// What crossed, counted as it goes (read by progress displays while a transfer runs).
#[derive(Debug, Default)]
pub struct TransferCounters {
    /// Bytes read from `docker save`, sent or not.
    pub read: AtomicU64,
    /// Bytes of the archive before compression.
    pub archive: AtomicU64,
    /// Bytes after compression: what crosses the network.
    pub wire: AtomicU64,
    /// Layers put in the archive.
    pub layers_sent: AtomicUsize,
    /// Layers left out (the receiver has them).
    pub layers_skipped: AtomicUsize,
}

impl TransferCounters {
    pub fn read(&self) -> u64 {
        self.read.load(Ordering::Relaxed)
    }
    pub fn wire(&self) -> u64 {
        self.wire.load(Ordering::Relaxed)
    }
    pub fn archive(&self) -> u64 {
        self.archive.load(Ordering::Relaxed)
    }
    pub fn layers_sent(&self) -> usize {
        self.layers_sent.load(Ordering::Relaxed)
    }
    pub fn layers_skipped(&self) -> usize {
        self.layers_skipped.load(Ordering::Relaxed)
    }
}

/// `sha256:` and the hexadecimal SHA-256 of `bytes`.
fn sha256(bytes: &[u8]) -> String {
    format!(
        "sha256:{}",
        hex::encode(ring::digest::digest(&ring::digest::SHA256, bytes))
    )
}

/// The chain ID of each layer of an image, bottom first: the first is its diff ID, each next
/// one `sha256(parent chain ID + " " + diff ID)`. Docker keeps layers by chain ID, so a layer
/// is the same only on the same layers below it.
pub fn chain_ids(diff_ids: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(diff_ids.len());
    for diff_id in diff_ids {
        let next = match out.last() {
            None => diff_id.clone(),
            Some(parent) => sha256(format!("{parent} {diff_id}").as_bytes()),
        };
        out.push(next);
    }
    out
}

/// Whether `id` is an image ID or diff ID as Docker writes them: `sha256:` and 64 lowercase
/// hexadecimal digits.
pub fn is_digest(id: &str) -> bool {
    id.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

fn invalid(field: &'static str, value: &str, rule: &'static str) -> DockerError {
    DockerError::InvalidName {
        field,
        value: value
            .chars()
            .take(80)
            .flat_map(char::escape_debug)
            .collect(),
        rule,
    }
}

/// Checks an offer before anything is asked of Docker.
pub fn check_offer(offer: &ImageOffer) -> Result<(), DockerError> {
    if !is_digest(&offer.id) {
        return Err(invalid(
            "id",
            &offer.id,
            "an image ID: sha256: and 64 lowercase hexadecimal digits",
        ));
    }
    if offer.layers.is_empty() || offer.layers.len() > 1024 {
        return Err(invalid(
            "layers",
            &offer.layers.len().to_string(),
            "1 to 1024 diff IDs, bottom layer first",
        ));
    }
    if let Some(bad) = offer.layers.iter().find(|l| !is_digest(l)) {
        return Err(invalid(
            "layers",
            bad,
            "a diff ID: sha256: and 64 lowercase hexadecimal digits",
        ));
    }
    for tag in &offer.tags {
        check_tag(tag)?;
    }
    Ok(())
}

/// A tag as an offer carries it: a reference with a tag and no digest (`app:1.2`).
fn check_tag(tag: &str) -> Result<(), DockerError> {
    check_image_reference(tag)?;
    if tag.contains('@') || split_tag(tag).is_none() {
        return Err(invalid(
            "tags",
            tag,
            "a tagged reference such as app:1.2 or registry.example.com/team/app:latest",
        ));
    }
    Ok(())
}

/// `repo:tag` split at the tag's colon (not a registry port's).
fn split_tag(reference: &str) -> Option<(&str, &str)> {
    let (repo, tag) = reference.rsplit_once(':')?;
    (!tag.contains('/') && !tag.is_empty() && !repo.is_empty()).then_some((repo, tag))
}

fn not_found(e: &bollard::errors::Error) -> bool {
    matches!(
        e,
        bollard::errors::Error::DockerResponseServerError {
            status_code: 404,
            ..
        }
    )
}

fn unreachable(host: &str, e: bollard::errors::Error) -> DockerError {
    match e {
        bollard::errors::Error::DockerResponseServerError { .. }
        | bollard::errors::Error::DockerStreamError { .. } => DockerError::Docker(e),
        other => DockerError::Unreachable(format!("at {host}: {other}")),
    }
}

/// The offer `docker` would make of its image `reference` (a tag, a name, or an ID): `None`
/// when it has no such image. A reference that is a tag is the offer's one tag; an ID carries
/// the image's own tags.
pub async fn describe(
    docker: &Docker,
    host: &str,
    reference: &str,
) -> Result<Option<ImageOffer>, DockerError> {
    check_image_reference(reference)?;
    check_image_store(docker, host).await?;
    let inspect = match docker.inspect_image(reference).await {
        Ok(i) => i,
        Err(e) if not_found(&e) => return Ok(None),
        Err(e) => return Err(unreachable(host, e)),
    };
    let id = inspect.id.unwrap_or_default();
    let layers = inspect.root_fs.and_then(|r| r.layers).unwrap_or_default();
    let own_tags = inspect.repo_tags.unwrap_or_default();
    // An ID, or a prefix of one, names the image itself: its own tags go with it.
    let hex = reference.strip_prefix("sha256:").unwrap_or(reference);
    let by_id = !hex.is_empty()
        && hex.bytes().all(|b| b.is_ascii_hexdigit())
        && id.trim_start_matches("sha256:").starts_with(hex);
    let tags = if by_id || reference.contains('@') {
        own_tags
    } else {
        // `app` means `app:latest`, and Docker lists `docker.io/library/app:1` as `app:1`.
        let wanted = if split_tag(reference).is_some() {
            reference.to_owned()
        } else {
            format!("{reference}:latest")
        };
        vec![wanted]
    };
    Ok(Some(ImageOffer { id, layers, tags }))
}

/// Refuses an engine that keeps images in the containerd image store (Docker Desktop, and new
/// installs of Docker 29): its `docker save` identifies an image by its manifest and names its
/// layers by their compressed digests, so neither the ID check nor the layer filter would hold.
pub async fn check_image_store(docker: &Docker, host: &str) -> Result<(), DockerError> {
    let info = docker.info().await.map_err(|e| unreachable(host, e))?;
    let containerd = info.driver_status.unwrap_or_default().iter().any(|pair| {
        pair.first().is_some_and(|k| k == "driver-type")
            && pair.get(1).is_some_and(|v| v.contains("containerd"))
    });
    if containerd {
        return Err(DockerError::ContainerdImageStore {
            host: host.to_owned(),
        });
    }
    Ok(())
}

/// Every chain ID of every image `docker` holds: the layers it has.
async fn chains_present(docker: &Docker, host: &str) -> Result<HashSet<String>, DockerError> {
    let list = docker
        .list_images(Some(ListImagesOptions {
            all: true,
            ..Default::default()
        }))
        .await
        .map_err(|e| unreachable(host, e))?;
    let inspected: Vec<_> = futures_util::stream::iter(list.into_iter().map(|image| async move {
        match docker.inspect_image(&image.id).await {
            Ok(i) => Ok(i.root_fs.and_then(|r| r.layers).unwrap_or_default()),
            // Removed since it was listed.
            Err(e) if not_found(&e) => Ok(Vec::new()),
            Err(e) => Err(unreachable(host, e)),
        }
    }))
    .buffer_unordered(8)
    .collect()
    .await;
    let mut present = HashSet::new();
    for layers in inspected {
        present.extend(chain_ids(&layers?));
    }
    Ok(present)
}

/// The receiving side of an offer: the image is here by ID (and now carries the offered tags),
/// or these are the layers to send.
pub async fn offer(
    docker: &Docker,
    host: &str,
    offer: &ImageOffer,
) -> Result<OfferAnswer, DockerError> {
    check_offer(offer)?;
    check_image_store(docker, host).await?;
    match docker.inspect_image(&offer.id).await {
        Ok(inspect) => {
            let has = inspect.repo_tags.unwrap_or_default();
            apply_tags(docker, host, &offer.id, &offer.tags, &has).await?;
            return Ok(OfferAnswer {
                present: true,
                missing: Vec::new(),
            });
        }
        Err(e) if not_found(&e) => {}
        Err(e) => return Err(unreachable(host, e)),
    }
    let present = chains_present(docker, host).await?;
    Ok(OfferAnswer {
        present: false,
        missing: missing_layers(&offer.layers, &present),
    })
}

/// Points each of `tags` (checked) that is not among `has` at image `id`.
async fn apply_tags(
    docker: &Docker,
    host: &str,
    id: &str,
    tags: &[String],
    has: &[String],
) -> Result<(), DockerError> {
    for tag in tags.iter().filter(|t| !has.contains(t)) {
        let (repo, tag_part) = split_tag(tag).expect("checked");
        docker
            .tag_image(
                id,
                Some(TagImageOptions {
                    repo: Some(repo.to_owned()),
                    tag: Some(tag_part.to_owned()),
                }),
            )
            .await
            .map_err(|e| unreachable(host, e))?;
    }
    Ok(())
}

/// The diff IDs of `layers` whose chain is not in `present`, each once, bottom first.
pub fn missing_layers(layers: &[String], present: &HashSet<String>) -> Vec<String> {
    let mut missing: Vec<String> = Vec::new();
    for (diff_id, chain) in layers.iter().zip(chain_ids(layers)) {
        if !present.contains(&chain) && !missing.contains(diff_id) {
            missing.push(diff_id.clone());
        }
    }
    missing
}

/// The images `docker` holds, tagged or not (not the intermediate layers of builds).
pub async fn list(docker: &Docker, host: &str) -> Result<Vec<ImageSummary>, DockerError> {
    let list = docker
        .list_images(None::<ListImagesOptions>)
        .await
        .map_err(|e| unreachable(host, e))?;
    let mut out: Vec<ImageSummary> = list
        .into_iter()
        .map(|i| {
            let mut tags: Vec<String> = i
                .repo_tags
                .into_iter()
                .filter(|t| t != "<none>:<none>")
                .collect();
            tags.sort();
            ImageSummary {
                id: i.id,
                tags,
                size: u64::try_from(i.size).unwrap_or(0),
                created: rfc3339_utc(i.created),
                containers: u64::try_from(i.containers).ok(),
            }
        })
        .collect();
    out.sort_by(|a, b| a.tags.cmp(&b.tags).then(a.id.cmp(&b.id)));
    Ok(out)
}

/// Seconds since the epoch as RFC 3339 UTC (`2026-12-06T08:38:27Z`).
fn rfc3339_utc(secs: i64) -> Option<String> {
    if secs <= 0 {
        return None;
    }
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    Some(format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    ))
}

/// Removes an image (a tag, a name or an ID) as `docker image rm` does; `force` also removes
/// it from under stopped containers and removes an ID with several tags.
pub async fn remove(
    docker: &Docker,
    host: &str,
    reference: &str,
    force: bool,
) -> Result<RemovedImage, DockerError> {
    check_image_reference(reference)?;
    match docker
        .remove_image(
            reference,
            Some(RemoveImageOptions {
                force,
                ..Default::default()
            }),
            None,
        )
        .await
    {
        Ok(items) => Ok(RemovedImage {
            untagged: items.iter().filter_map(|i| i.untagged.clone()).collect(),
            deleted: items.iter().filter_map(|i| i.deleted.clone()).collect(),
        }),
        Err(e) if not_found(&e) => Err(DockerError::ImageUnavailable {
            image: reference.to_owned(),
            reason: "no such image on this Machine".to_owned(),
        }),
        Err(e) => Err(unreachable(host, e)),
    }
}

/// A writer that hands what it is given, in chunks, to the other end of a channel (blocking
/// while the channel is full: the connection sets the pace). A chunk goes when it is full or
/// when `keepalive` has passed since the last one: what compresses to almost nothing (a layer
/// of gigabytes of zeros, about 4 bytes per 128 KiB) would otherwise take gigabytes of reading
/// to fill a chunk, and leave the receiver's idle bound waiting meanwhile.
struct ChannelWriter {
    tx: tokio::sync::mpsc::Sender<io::Result<Bytes>>,
    buf: Vec<u8>,
    counters: Arc<TransferCounters>,
    keepalive: Duration,
    sent_at: std::time::Instant,
}

impl ChannelWriter {
    fn new(
        tx: tokio::sync::mpsc::Sender<io::Result<Bytes>>,
        counters: Arc<TransferCounters>,
        keepalive: Duration,
    ) -> ChannelWriter {
        ChannelWriter {
            tx,
            buf: Vec::with_capacity(CHUNK),
            counters,
            keepalive,
            sent_at: std::time::Instant::now(),
        }
    }

    fn send(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            self.sent_at = std::time::Instant::now();
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK)));
        self.counters
            .wire
            .fetch_add(chunk.len() as u64, Ordering::Relaxed);
        let sent = self
            .tx
            .blocking_send(Ok(chunk))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the receiver went away"));
        // From when the connection took it: a full channel (a slow link) is not a quiet one.
        self.sent_at = std::time::Instant::now();
        sent
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(bytes);
        if self.buf.len() >= CHUNK || self.sent_at.elapsed() >= self.keepalive {
            self.send()?;
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.send()
    }
}

/// Counts what passes into the compressor.
struct Counting<W> {
    inner: W,
    counters: Arc<TransferCounters>,
}

impl<W: Write> Write for Counting<W> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(bytes)?;
        self.counters.archive.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// A layer file of a `docker save` archive: `<v1 id>/layer.tar` (Docker before 25), or an OCI
/// blob `blobs/sha256/<hex>` (Docker 25 and later, where layers are blobs named by diff ID;
/// configs and manifests are blobs too, and are never left out).
enum Entry {
    LegacyLayer,
    Blob(String),
    Other,
}

fn classify(path: &std::path::Path) -> Entry {
    let parts: Vec<&str> = path.iter().filter_map(|p| p.to_str()).collect();
    match parts.as_slice() {
        [_, "layer.tar"] => Entry::LegacyLayer,
        ["blobs", "sha256", hex] => Entry::Blob(format!("sha256:{hex}")),
        _ => Entry::Other,
    }
}

/// zstd frames into `inner`: one long frame, ended and followed by an empty skippable frame
/// whenever [`Frames::keepalive`] is called.
struct Frames<W: Write> {
    encoder: Option<zstd::stream::write::Encoder<'static, W>>,
}

impl<W: Write> Frames<W> {
    fn new(inner: W) -> io::Result<Frames<W>> {
        Ok(Frames {
            encoder: Some(zstd::stream::write::Encoder::new(inner, ZSTD_LEVEL)?),
        })
    }

    fn encoder(&mut self) -> &mut zstd::stream::write::Encoder<'static, W> {
        self.encoder.as_mut().expect("an encoder between calls")
    }

    /// Ends the frame under way, writes an empty skippable frame and flushes: bytes on the wire
    /// now, which a decoder skips.
    fn keepalive(&mut self) -> io::Result<()> {
        let mut inner = self.encoder.take().expect("an encoder").finish()?;
        inner.write_all(&SKIPPABLE)?;
        inner.flush()?;
        self.encoder = Some(zstd::stream::write::Encoder::new(inner, ZSTD_LEVEL)?);
        Ok(())
    }

    fn finish(mut self) -> io::Result<W> {
        self.encoder.take().expect("an encoder").finish()
    }
}

impl<W: Write> Write for Frames<W> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.encoder().write(bytes)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.encoder().flush()
    }
}

/// Counts what is read from `docker save`.
struct Reading<R> {
    inner: R,
    counters: Arc<TransferCounters>,
}

impl<R: Read> Read for Reading<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.counters.read.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// Copies a `docker save` archive from `input` to `output` as a zstd-compressed archive,
/// leaving out each layer whose diff ID is in `skip`; `layers` (the image's diff IDs) tells
/// layers from the other blobs of an OCI layout when counting. A legacy layer's diff ID is the
/// SHA-256 of its file, read once into a spool file (never into memory) while it is hashed.
/// While it reads what it does not write yet, it sends a keep-alive every [`KEEPALIVE`].
pub fn filter_archive(
    input: impl Read,
    output: impl Write,
    skip: &HashSet<String>,
    layers: &HashSet<String>,
    counters: &Arc<TransferCounters>,
) -> io::Result<()> {
    filter_with_keepalive(input, output, skip, layers, counters, KEEPALIVE)
}

fn filter_with_keepalive(
    input: impl Read,
    output: impl Write,
    skip: &HashSet<String>,
    layers: &HashSet<String>,
    counters: &Arc<TransferCounters>,
    keepalive: Duration,
) -> io::Result<()> {
    let mut archive = tar::Archive::new(Reading {
        inner: input,
        counters: counters.clone(),
    });
    let mut builder = tar::Builder::new(Counting {
        inner: Frames::new(output)?,
        counters: counters.clone(),
    });
    builder.mode(tar::HeaderMode::Complete);
    // Since when nothing was written.
    let quiet_since = std::cell::Cell::new(std::time::Instant::now());
    // Reads `from` to its end into `sink`, keeping the link alive as it goes.
    let drain = |from: &mut dyn Read,
                 sink: &mut dyn FnMut(&[u8]) -> io::Result<()>,
                 builder: &mut tar::Builder<Counting<Frames<_>>>|
     -> io::Result<()> {
        let mut chunk = vec![0u8; 64 * 1024];
        loop {
            let n = from.read(&mut chunk)?;
            if n == 0 {
                return Ok(());
            }
            sink(&chunk[..n])?;
            if quiet_since.get().elapsed() >= keepalive {
                builder.get_mut().inner.keepalive()?;
                quiet_since.set(std::time::Instant::now());
            }
        }
    };
    for entry in archive.entries()? {
        let mut entry = entry?;
        let mut header = entry.header().clone();
        // The real size, which a PAX extension carries for an entry over 8 GiB.
        header.set_size(entry.size());
        let path = entry.path()?.into_owned();
        let kind = if header.entry_type().is_file() {
            classify(&path)
        } else {
            Entry::Other
        };
        match kind {
            Entry::Other if header.entry_type().is_file() => {
                builder.append_data(&mut header, &path, &mut entry)?
            }
            Entry::Other => builder.append(&header, &mut entry)?,
            Entry::Blob(digest) if skip.contains(&digest) => {
                drain(&mut entry, &mut |_| Ok(()), &mut builder)?;
                counters.layers_skipped.fetch_add(1, Ordering::Relaxed);
            }
            Entry::Blob(digest) => {
                builder.append_data(&mut header, &path, &mut entry)?;
                quiet_since.set(std::time::Instant::now());
                if layers.contains(&digest) {
                    counters.layers_sent.fetch_add(1, Ordering::Relaxed);
                }
            }
            Entry::LegacyLayer => {
                let mut spool = tempfile::tempfile()?;
                let mut hash = ring::digest::Context::new(&ring::digest::SHA256);
                drain(
                    &mut entry,
                    &mut |bytes| {
                        hash.update(bytes);
                        spool.write_all(bytes)
                    },
                    &mut builder,
                )?;
                let diff_id = format!("sha256:{}", hex::encode(hash.finish()));
                if skip.contains(&diff_id) {
                    counters.layers_skipped.fetch_add(1, Ordering::Relaxed);
                } else {
                    header.set_size(spool.stream_position()?);
                    spool.rewind()?;
                    builder.append_data(&mut header, &path, &mut spool)?;
                    quiet_since.set(std::time::Instant::now());
                    counters.layers_sent.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
    let counting = builder.into_inner()?;
    let mut output = counting.inner.finish()?;
    output.flush()
}

/// Streams image `id` out of `docker` without the layers whose diff IDs are in `skip` (the
/// receiver has them): the archive [`filter_archive`] makes of `docker save`, in chunks as
/// they are made. An error (Docker's, or the archive's) ends the stream with it, so the
/// receiver never loads a shortened archive.
pub fn export(
    docker: &Docker,
    id: &str,
    skip: HashSet<String>,
    layers: HashSet<String>,
    counters: Arc<TransferCounters>,
) -> impl Stream<Item = io::Result<Bytes>> + Send + 'static {
    // `docker save` of a large image answers only once Docker has laid it out on its disk.
    let docker = docker.clone().with_timeout(LOAD_TIMEOUT);
    let save = docker.export_image(id).map_err(io::Error::other);
    let reader = tokio_util::io::StreamReader::new(save);
    let (tx, rx) = tokio::sync::mpsc::channel(CHANNEL_CHUNKS);
    let bridge = tokio_util::io::SyncIoBridge::new(reader);
    tokio::task::spawn_blocking(move || {
        let failed = tx.clone();
        let writer = ChannelWriter::new(tx, counters.clone(), KEEPALIVE);
        if let Err(e) = filter_archive(bridge, writer, &skip, &layers, &counters) {
            let _ = failed.blocking_send(Err(e));
        }
    });
    futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    })
}

/// `stream`, failing when its first item does not come within `first`, or a next one within
/// `idle` of the one before: a link that stops carrying a transfer ends it.
pub fn bounded<S>(
    stream: S,
    first: Duration,
    idle: Duration,
) -> impl Stream<Item = io::Result<Bytes>> + Send + Unpin + 'static
where
    S: Stream<Item = io::Result<Bytes>> + Send + Unpin + 'static,
{
    Box::pin(futures_util::stream::unfold(
        (stream, first),
        move |(mut stream, within)| async move {
            match tokio::time::timeout(within, stream.next()).await {
                Ok(Some(item)) => Some((item, (stream, idle))),
                Ok(None) => None,
                Err(_) => Some((
                    Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("no byte of the image for {} s", within.as_secs()),
                    )),
                    (stream, Duration::ZERO),
                )),
            }
        },
    ))
}

/// The layers of `offer` to leave out for a receiver that answered `missing`.
pub fn skipped(offer: &ImageOffer, missing: &[String]) -> HashSet<String> {
    offer
        .layers
        .iter()
        .filter(|l| !missing.contains(l))
        .cloned()
        .collect()
}

/// Decompresses a zstd stream on a blocking thread, chunk by chunk.
fn decompress<S>(
    body: S,
    received: Arc<AtomicU64>,
    broke: Arc<std::sync::Mutex<Option<String>>>,
) -> impl Stream<Item = io::Result<Bytes>>
where
    S: Stream<Item = io::Result<Bytes>> + Send + Unpin + 'static,
{
    // Docker's client reports a body that failed as a failed request and no more: why it
    // failed is kept here for the error `load` gives.
    let note = move |e: &io::Error| {
        let mut first = broke.lock().unwrap_or_else(|p| p.into_inner());
        first.get_or_insert_with(|| e.to_string());
    };
    let counted = body.inspect_ok(move |chunk| {
        received.fetch_add(chunk.len() as u64, Ordering::Relaxed);
    });
    let reader = tokio_util::io::StreamReader::new(counted);
    let bridge = tokio_util::io::SyncIoBridge::new(reader);
    let (tx, rx) = tokio::sync::mpsc::channel::<io::Result<Bytes>>(CHANNEL_CHUNKS);
    tokio::task::spawn_blocking(move || {
        let mut decoder = match zstd::stream::read::Decoder::new(bridge) {
            Ok(d) => d,
            Err(e) => {
                note(&e);
                let _ = tx.blocking_send(Err(e));
                return;
            }
        };
        loop {
            let mut chunk = vec![0u8; CHUNK];
            match decoder.read(&mut chunk) {
                Ok(0) => return,
                Ok(n) => {
                    chunk.truncate(n);
                    if tx.blocking_send(Ok(Bytes::from(chunk))).is_err() {
                        return;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    note(&e);
                    let _ = tx.blocking_send(Err(e));
                    return;
                }
            }
        }
    });
    futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    })
}

/// Loads an archive [`export`] made into `docker`, checks the image `id` is there after, and
/// points `tags` at it. `docker` must allow a long request ([`LOAD_TIMEOUT`]): Docker answers
/// only once the whole archive is in.
pub async fn load<S>(
    docker: &Docker,
    host: &str,
    id: &str,
    tags: &[String],
    body: S,
) -> Result<LoadedImage, DockerError>
where
    S: Stream<Item = io::Result<Bytes>> + Send + Unpin + 'static,
{
    if !is_digest(id) {
        return Err(invalid(
            "id",
            id,
            "an image ID: sha256: and 64 lowercase hexadecimal digits",
        ));
    }
    for tag in tags {
        check_tag(tag)?;
    }
    let received = Arc::new(AtomicU64::new(0));
    let broke = Arc::new(std::sync::Mutex::new(None));
    let archive = decompress(body, received.clone(), broke.clone());
    let mut answers = docker.import_image_stream(
        ImportImageOptions {
            quiet: true,
            ..Default::default()
        },
        archive,
        None,
    );
    let mut said = Vec::new();
    while let Some(answer) = answers.next().await {
        match answer {
            Ok(info) => {
                if let Some(text) = info.stream.filter(|s| !s.trim().is_empty()) {
                    said.push(text.trim().to_owned());
                }
            }
            Err(e) => {
                let why = broke.lock().unwrap_or_else(|p| p.into_inner()).take();
                let reason = match why {
                    Some(why) => format!(
                        "the image stopped arriving after {} bytes: {why}; send it again (a Machine is sent only the layers it lacks)",
                        received.load(Ordering::Relaxed)
                    ),
                    None => format!("docker load refused what arrived: {}", ployz_core::error_chain(&e)),
                };
                return Err(DockerError::ImageNotLoaded {
                    image: id.to_owned(),
                    reason,
                });
            }
        }
    }
    match docker.inspect_image(id).await {
        Ok(inspect) => {
            let mut has = inspect.repo_tags.unwrap_or_default();
            apply_tags(docker, host, id, tags, &has).await?;
            for tag in tags {
                if !has.contains(tag) {
                    has.push(tag.clone());
                }
            }
            has.sort();
            Ok(LoadedImage {
                id: id.to_owned(),
                tags: has,
                received: received.load(Ordering::Relaxed),
            })
        }
        Err(e) if not_found(&e) => Err(DockerError::ImageNotLoaded {
            image: id.to_owned(),
            reason: format!(
                "what arrived loaded as another image ({}); send it again",
                said.join("; ")
            ),
        }),
        Err(e) => Err(unreachable(host, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Docker that takes a request's head and body and never answers.
    fn silent_docker(dir: &std::path::Path) -> Docker {
        let path = dir.join("docker.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        std::thread::spawn(move || {
            for mut stream in listener.incoming().flatten() {
                std::thread::spawn(move || {
                    let mut sink = [0u8; 8192];
                    while matches!(stream.read(&mut sink), Ok(n) if n > 0) {}
                });
            }
        });
        Docker::connect_with_unix(path.to_str().unwrap(), 30, bollard::API_DEFAULT_VERSION).unwrap()
    }

    #[tokio::test]
    async fn a_transfer_that_breaks_off_says_why_not_that_docker_refused_it() {
        let dir = tempfile::tempdir().unwrap();
        let docker = silent_docker(dir.path());
        let id = format!("sha256:{}", "a".repeat(64));
        let start = zstd::encode_all(&b"the start of an archive"[..], 3).unwrap();
        let body = futures_util::stream::iter(vec![
            Ok(Bytes::from(start)),
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "no byte of the body for 30 s",
            )),
        ]);
        let e = load(&docker, "unix:///test", &id, &[], Box::pin(body))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("did not load here")
                && e.contains("stopped arriving")
                && e.contains("no byte of the body for 30 s")
                && e.contains("send it again"),
            "{e}"
        );
        assert!(!e.contains("could not be pulled"), "{e}");
    }

    fn d(n: u8) -> String {
        sha256(&[n])
    }

    #[test]
    fn chain_ids_are_dockers() {
        // Docker 20.10's own: an image of two layers (busybox, then `COPY a /a`) as
        // `docker image inspect` lists its diff IDs, and the chain ID its layer database names
        // the second layer by (/var/lib/docker/image/overlay2/layerdb/sha256/).
        let base = "sha256:0430451cdf018207d9f4a37e05d99b79411bd921d5642b5c25218b735f271a3a";
        let top = "sha256:09e4e36ac0ebb5da78fba46e20bce5b9c7b9d087e6dbd6249745d9f4b6efb901";
        let chains = chain_ids(&[base.to_owned(), top.to_owned()]);
        assert_eq!(
            chains,
            [
                base,
                "sha256:5b654633a31fb5e5c499a3d19d09c3a6b24bbf6a5f61cf5194e668e5221b3af0"
            ]
        );
    }

    #[test]
    fn a_layer_is_present_only_on_the_same_layers_below() {
        let present: HashSet<String> = chain_ids(&[d(1), d(2)]).into_iter().collect();
        assert_eq!(missing_layers(&[d(1), d(2), d(3)], &present), [d(3)]);
        // The same diff ID on another base is another layer.
        assert_eq!(missing_layers(&[d(9), d(2)], &present), [d(9), d(2)]);
        // A diff ID twice is sent once.
        assert_eq!(missing_layers(&[d(4), d(4)], &HashSet::new()), [d(4)]);
    }

    #[test]
    fn offers_are_checked_naming_the_field() {
        let good = ImageOffer {
            id: d(0),
            layers: vec![d(1)],
            tags: vec!["registry.example.com:5000/app:1.2".into()],
        };
        check_offer(&good).unwrap();
        let cases = [
            (
                ImageOffer {
                    id: "sha256:XYZ".into(),
                    ..good.clone()
                },
                "id",
            ),
            (
                ImageOffer {
                    layers: vec![],
                    ..good.clone()
                },
                "layers",
            ),
            (
                ImageOffer {
                    layers: vec!["../etc".into()],
                    ..good.clone()
                },
                "layers",
            ),
            (
                ImageOffer {
                    tags: vec!["app".into()],
                    ..good.clone()
                },
                "tags",
            ),
            (
                ImageOffer {
                    tags: vec!["app@sha256:00".into()],
                    ..good.clone()
                },
                "tags",
            ),
        ];
        for (offer, field) in cases {
            let e = check_offer(&offer).unwrap_err();
            assert!(
                matches!(&e, DockerError::InvalidName { field: f, .. } if *f == field),
                "{offer:?}: {e}"
            );
        }
    }

    #[test]
    fn tags_split_at_the_tag_not_the_port() {
        assert_eq!(split_tag("app:1"), Some(("app", "1")));
        assert_eq!(
            split_tag("reg.example:5000/app:v2"),
            Some(("reg.example:5000/app", "v2"))
        );
        assert_eq!(split_tag("reg.example:5000/app"), None);
        assert_eq!(split_tag("app"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_transfer_that_stops_coming_ends_with_an_error() {
        let first = Duration::from_secs(600);
        let idle = Duration::from_secs(60);
        // One chunk, then nothing: the next read fails once `idle` has passed.
        let stalled = futures_util::stream::once(async { Ok(Bytes::from_static(b"x")) })
            .chain(futures_util::stream::pending());
        let mut s = bounded(Box::pin(stalled), first, idle);
        assert_eq!(s.next().await.unwrap().unwrap(), Bytes::from_static(b"x"));
        let e = s.next().await.unwrap().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(e.to_string().contains("60 s"), "{e}");
        // Nothing at all: the first byte's allowance applies.
        let silent = futures_util::stream::pending::<io::Result<Bytes>>();
        let e = bounded(Box::pin(silent), first, idle)
            .next()
            .await
            .unwrap()
            .unwrap_err();
        assert!(e.to_string().contains("600 s"), "{e}");
    }

    #[test]
    fn times_read_as_rfc3339() {
        assert_eq!(
            rfc3339_utc(1_796_459_907).as_deref(),
            Some("2026-12-05T08:38:27Z")
        );
        assert_eq!(
            rfc3339_utc(951_782_400).as_deref(),
            Some("2000-02-29T00:00:00Z")
        );
        assert_eq!(rfc3339_utc(0), None);
    }

    /// An archive shaped as `docker save` writes one (Docker before 25): two layers, a config,
    /// the manifest.
    fn saved(layers: &[&[u8]]) -> (Vec<u8>, Vec<String>) {
        let mut builder = tar::Builder::new(Vec::new());
        let mut diff_ids = Vec::new();
        let mut names = Vec::new();
        for (i, layer) in layers.iter().enumerate() {
            let dir = format!("{i:064x}");
            let mut header = tar::Header::new_gnu();
            header.set_size(layer.len() as u64);
            header.set_mode(0o644);
            header.set_entry_type(tar::EntryType::Regular);
            builder
                .append_data(&mut header, format!("{dir}/layer.tar"), *layer)
                .unwrap();
            diff_ids.push(sha256(layer));
            names.push(format!("{dir}/layer.tar"));
        }
        let manifest = serde_json::json!([{"Config": "c.json", "Layers": names}]).to_string();
        for (name, body) in [
            ("c.json", b"{}".as_slice()),
            ("manifest.json", manifest.as_bytes()),
        ] {
            let mut header = tar::Header::new_gnu();
            header.set_size(body.len() as u64);
            header.set_mode(0o644);
            header.set_entry_type(tar::EntryType::Regular);
            builder.append_data(&mut header, name, body).unwrap();
        }
        (builder.into_inner().unwrap(), diff_ids)
    }

    fn entries(compressed: &[u8]) -> Vec<(String, Vec<u8>)> {
        let plain = zstd::stream::decode_all(compressed).unwrap();
        let mut archive = tar::Archive::new(plain.as_slice());
        archive
            .entries()
            .unwrap()
            .map(|e| {
                let mut e = e.unwrap();
                let path = e.path().unwrap().to_string_lossy().into_owned();
                let mut body = Vec::new();
                e.read_to_end(&mut body).unwrap();
                (path, body)
            })
            .collect()
    }

    #[test]
    fn the_archive_leaves_out_the_layers_the_receiver_has_and_keeps_the_rest_whole() {
        let big: Vec<u8> = (0..300_000u32).flat_map(|i| i.to_le_bytes()).collect();
        let (archive, diff_ids) = saved(&[b"base layer", &big]);
        let counters = Arc::new(TransferCounters::default());
        let mut out = Vec::new();
        let skip: HashSet<String> = [diff_ids[0].clone()].into();
        let layers: HashSet<String> = diff_ids.iter().cloned().collect();
        filter_archive(archive.as_slice(), &mut out, &skip, &layers, &counters).unwrap();
        let got = entries(&out);
        let names: Vec<&str> = got.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            names,
            [
                format!("{:064x}/layer.tar", 1).as_str(),
                "c.json",
                "manifest.json"
            ]
        );
        assert_eq!(got[0].1, big);
        assert_eq!(counters.layers_sent(), 1);
        assert_eq!(counters.layers_skipped(), 1);
        assert_eq!(
            counters.wire(),
            0,
            "only the channel writer counts the wire"
        );
        assert!(counters.archive() > big.len() as u64);
        assert!((out.len() as u64) < counters.archive(), "compressed");
    }

    #[test]
    fn oci_blobs_are_left_out_by_name_and_other_blobs_kept() {
        let layer = b"a layer".as_slice();
        let config = b"{\"config\":1}".as_slice();
        let (layer_id, config_id) = (sha256(layer), sha256(config));
        let mut builder = tar::Builder::new(Vec::new());
        for (id, body) in [(&layer_id, layer), (&config_id, config)] {
            let mut header = tar::Header::new_gnu();
            header.set_size(body.len() as u64);
            header.set_mode(0o644);
            header.set_entry_type(tar::EntryType::Regular);
            let name = format!("blobs/sha256/{}", id.trim_start_matches("sha256:"));
            builder.append_data(&mut header, name, body).unwrap();
        }
        let archive = builder.into_inner().unwrap();
        let counters = Arc::new(TransferCounters::default());
        let mut out = Vec::new();
        filter_archive(
            archive.as_slice(),
            &mut out,
            &[layer_id.clone()].into(),
            &[layer_id].into(),
            &counters,
        )
        .unwrap();
        let got = entries(&out);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].1, config);
        // The config blob is not counted as a layer.
        assert_eq!(counters.layers_sent(), 0);
        assert_eq!(counters.layers_skipped(), 1);
    }

    #[test]
    fn a_cut_off_archive_is_an_error_not_a_shorter_archive() {
        let (archive, _) = saved(&[b"base layer"]);
        let counters = Arc::new(TransferCounters::default());
        let mut out = Vec::new();
        let cut = &archive[..700];
        assert!(
            filter_archive(cut, &mut out, &HashSet::new(), &HashSet::new(), &counters).is_err()
        );
    }

    #[test]
    fn what_compresses_to_almost_nothing_is_sent_without_waiting_for_a_full_chunk() {
        // 64 MiB of zeros compress to a few kilobytes: far from a chunk. The archive's last
        // bytes are held back until a chunk has arrived (or 30 s have passed): what was made
        // of the rest must be on its way before the archive ends.
        struct Gated {
            archive: Vec<u8>,
            pos: usize,
            hold_at: usize,
            go: std::sync::mpsc::Receiver<()>,
            held_for_ever: Arc<std::sync::atomic::AtomicBool>,
        }
        impl Read for Gated {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                if self.pos == self.hold_at
                    && self.go.recv_timeout(Duration::from_secs(30)).is_err()
                {
                    self.held_for_ever.store(true, Ordering::SeqCst);
                }
                let end = if self.pos < self.hold_at {
                    self.hold_at
                } else {
                    self.archive.len()
                };
                let n = buf.len().min(end - self.pos);
                buf[..n].copy_from_slice(&self.archive[self.pos..self.pos + n]);
                self.pos += n;
                Ok(n)
            }
        }
        let zeros = vec![0u8; 64 << 20];
        let (archive, diff_ids) = saved(&[&zeros, b"top layer"]);
        let (go, gate) = std::sync::mpsc::channel();
        let held_for_ever = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let input = Gated {
            hold_at: archive.len() - 1024,
            archive,
            pos: 0,
            go: gate,
            held_for_ever: held_for_ever.clone(),
        };
        let counters = Arc::new(TransferCounters::default());
        let (tx, mut rx) = tokio::sync::mpsc::channel(CHANNEL_CHUNKS);
        // Every write finds the keep-alive passed; the archive's own keep-alive (while a layer
        // is read and hashed) never comes, so only the writer can send early.
        let writer = ChannelWriter::new(tx, counters.clone(), Duration::ZERO);
        let layers: HashSet<String> = diff_ids.iter().cloned().collect();
        let sender = std::thread::spawn(move || {
            filter_with_keepalive(
                input,
                writer,
                &HashSet::new(),
                &layers,
                &counters,
                Duration::from_secs(24 * 3600),
            )
        });
        let first = rx.blocking_recv().expect("a chunk").unwrap();
        assert!(
            !held_for_ever.load(Ordering::SeqCst),
            "nothing was sent before the archive ended"
        );
        assert!(first.len() < CHUNK, "{} bytes", first.len());
        go.send(()).unwrap();
        let mut wire = first.to_vec();
        while let Some(chunk) = rx.blocking_recv() {
            wire.extend_from_slice(&chunk.unwrap());
        }
        sender.join().unwrap().unwrap();
        assert!(wire.len() < 64 << 10, "{} bytes on the wire", wire.len());
        let got = entries(&wire);
        assert_eq!(got[0].1.len(), zeros.len());
        assert!(got[0].1.iter().all(|b| *b == 0));
        assert_eq!(got[1].1, b"top layer");
    }

    #[test]
    fn keepalives_while_skipping_are_frames_a_decoder_passes_over() {
        let big: Vec<u8> = (0..200_000u32).flat_map(|i| i.to_le_bytes()).collect();
        let (archive, diff_ids) = saved(&[&big, b"top layer"]);
        let counters = Arc::new(TransferCounters::default());
        let mut out = Vec::new();
        let skip: HashSet<String> = [diff_ids[0].clone()].into();
        // A keep-alive after every chunk read of the skipped layer.
        filter_with_keepalive(
            archive.as_slice(),
            &mut out,
            &skip,
            &diff_ids.iter().cloned().collect(),
            &counters,
            Duration::ZERO,
        )
        .unwrap();
        let frames = out
            .windows(SKIPPABLE.len())
            .filter(|w| *w == SKIPPABLE)
            .count();
        assert!(frames >= 10, "{frames} keep-alives");
        let got = entries(&out);
        assert_eq!(got.len(), 3, "the top layer, the config, the manifest");
        assert_eq!(got[0].1, b"top layer");
        // All of it read, but the archive's closing blocks, which the reader stops before.
        assert!(counters.read() + 1024 >= archive.len() as u64);
    }
}
