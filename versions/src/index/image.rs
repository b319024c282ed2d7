//! Index images: the SPI as of a checkpoint, written in key order, merged
//! run by run, read back on restore.

use std::ops::Range;

use bytes::Bytes;

use fovea_types::error::{Error, Result};
use fovea_types::ids::{RowId, Ts};

use super::*;

/// Format of the index images checkpoints write ([`write_image`]): 3
/// has keys in today's encoding ([`encode_key`]); 2, the same layout,
/// held integers in 9 bytes ([`upgrade_key`]).
pub(super) const IMAGE_FORMAT: u32 = 3;

/// The format of images in [`IMAGE_FORMAT`]'s layout whose keys encode
/// integers as `0x01` and 8 bytes.
pub(super) const IMAGE_FORMAT_WIDE_INTS: u32 = 2;

/// Rewrites a key of an image before format 3 in today's encoding
/// ([`upgrade_key`] with the checkpoint's tables).
pub type KeyUpgrade<'a> = &'a dyn Fn(&[u8]) -> Result<KeyBytes>;

/// The key rewrite an image of `format` needs (`None`: its keys are
/// today's), refusing an older image without one.
pub(super) fn key_upgrade(format: u32, upgrade: Option<KeyUpgrade<'_>>) -> Result<Option<KeyUpgrade<'_>>> {
    if format == IMAGE_FORMAT {
        return Ok(None);
    }
    upgrade.map(Some).ok_or_else(|| {
        image_corrupt(&format!(
            "an image of format {format} has keys of an older encoding and no tables to read them by"
        ))
    })
}

/// Writes an index image of format 3: for each key, in strictly
/// ascending byte order, the version a snapshot sees (`None` row: the key
/// is removed; `keep_removed` false leaves those out, as a base needs no
/// removals, a delta keeps them). Magic, format, count, entries (key
/// length u32, key, ts u64, row u64 with `u64::MAX` for removed), CRC32;
/// all LE. Readers skip the removals a base holds (a checkpoint's
/// [`ImageWriter`] keeps them: it fixes the count first).
pub fn write_image<'a>(entries: impl IntoIterator<Item = (&'a [u8], VersionAt)>, keep_removed: bool) -> Vec<u8> {
    let mut out = image_header(0);
    let mut count = 0;
    for (key, (ts, row)) in entries {
        if row.is_some() || keep_removed {
            push_entry(&mut out, key, ts.get(), row.map_or(TOMBSTONE, |r| r.0));
            count += 1;
        }
    }
    finish_image(out, count)
}

pub(super) fn image_header(count: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(IMAGE_HEADER);
    out.extend_from_slice(INDEX_MAGIC);
    out.extend_from_slice(&IMAGE_FORMAT.to_le_bytes());
    out.extend_from_slice(&count.to_le_bytes());
    out
}

/// Writes an image as [`write_image`] does (removals kept), an entry at a
/// time, its entry count fixed first, so that it can leave in pieces as it
/// is written: a checkpoint looks versions up in chunks and streams the
/// image to the store, holding one piece, not the image.
pub struct ImageWriter {
    /// Bytes not yet taken.
    pub(super) out: Vec<u8>,
    /// CRC32 of the bytes taken.
    pub(super) crc: crc32fast::Hasher,
    pub(super) count: u64,
    pub(super) pushed: u64,
}

impl ImageWriter {
    /// An image of `count` entries.
    pub fn new(count: u64) -> Self {
        ImageWriter { out: image_header(count), crc: crc32fast::Hasher::new(), count, pushed: 0 }
    }

    /// Appends a key (keys in strictly ascending byte order).
    pub fn push(&mut self, key: &[u8], (ts, row): VersionAt) {
        push_entry(&mut self.out, key, ts.get(), row.map_or(TOMBSTONE, |r| r.0));
        self.pushed += 1;
    }

    /// The bytes written since the last piece, once there are at least
    /// `min`; pieces in the order taken, then [`Self::finish`]'s, are the image.
    pub fn take_piece(&mut self, min: usize) -> Option<Vec<u8>> {
        (self.out.len() >= min).then(|| {
            self.crc.update(&self.out);
            std::mem::replace(&mut self.out, Vec::with_capacity(min + min / 8))
        })
    }

    /// The last piece (the bytes not taken, then the CRC). Fails when the
    /// entries pushed are not the count given.
    pub fn finish(mut self) -> Result<Vec<u8>> {
        if self.pushed != self.count {
            return Err(Error::invariant(format!("an index image of {} entries got {}", self.count, self.pushed)));
        }
        self.crc.update(&self.out);
        let crc = self.crc.finalize();
        self.out.extend_from_slice(&crc.to_le_bytes());
        Ok(self.out)
    }
}

pub(super) fn push_entry(out: &mut Vec<u8>, key: &[u8], ts: u64, row: u64) {
    out.extend_from_slice(&(key.len() as u32).to_le_bytes());
    out.extend_from_slice(key);
    out.extend_from_slice(&ts.to_le_bytes());
    out.extend_from_slice(&row.to_le_bytes());
}

pub(super) fn finish_image(mut out: Vec<u8>, count: u64) -> Vec<u8> {
    let at = INDEX_MAGIC.len() + 4;
    out[at..at + 8].copy_from_slice(&count.to_le_bytes());
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Folds a base image and the deltas after it (oldest first; all of
/// format 3, so in key order) into one base image, in one streaming pass:
/// for a key in several, the newest wins; removed keys are left out.
pub fn merge_images(runs: &[&[u8]]) -> Result<Vec<u8>> {
    let mut runs: Vec<ImageRun<'_>> = runs.iter().map(|r| ImageRun::in_memory(r)).collect();
    let mut merged = Vec::new();
    merge_images_into(&mut runs, usize::MAX, |piece| {
        merged.extend_from_slice(piece);
        Ok(())
    })?;
    Ok(merged)
}

/// [`merge_images`] of runs read in pieces ([`ImageRun`]), handing the
/// merged image to `sink` in pieces of about `piece` bytes as it is
/// written: neither the runs nor the merged image are whole in memory (a
/// checkpoint reads them from the store and writes to it). The runs are
/// walked twice, first to count the entries (an image's count comes
/// first), then to write them. Returns the merged image's size.
pub fn merge_images_into(
    runs: &mut [ImageRun<'_>],
    piece: usize,
    mut sink: impl FnMut(&[u8]) -> Result<()>,
) -> Result<u64> {
    let mut count = 0u64;
    merge_runs(runs, |_, _, _| {
        count += 1;
        Ok(())
    })?;
    let mut image = ImageWriter::new(count);
    let mut size = 0u64;
    merge_runs(runs, |key, ts, row| {
        image.push(key, (Ts(ts), Some(RowId(row))));
        if let Some(p) = image.take_piece(piece) {
            size += p.len() as u64;
            sink(&p)?;
        }
        Ok(())
    })?;
    let last = image.finish()?;
    size += last.len() as u64;
    sink(&last)?;
    Ok(size)
}

/// One image run of a merge, read front to back a range at a time
/// through `read` (the bytes of a range of the image), its CRC checked
/// as it goes (a corrupt run fails the merge when its end is reached).
pub struct ImageRun<'r> {
    pub(super) size: u64,
    pub(super) read: Box<dyn FnMut(Range<u64>) -> Result<Bytes> + 'r>,
    /// Bytes fetched per read.
    pub(super) fetch: u64,
    /// Fetched bytes from `pos` on.
    pub(super) buf: Bytes,
    pub(super) pos: u64,
    pub(super) crc: crc32fast::Hasher,
    /// Entries left; the head entry (key in `key`).
    pub(super) left: u64,
    pub(super) key: Vec<u8>,
    pub(super) head: Option<(u64, u64)>,
    /// The buffer the next key is read into (swapped with `key`).
    pub(super) next_key: Vec<u8>,
}

impl<'r> ImageRun<'r> {
    /// A run of `size` bytes fetched `fetch` bytes at a time with `read`.
    pub fn new(size: u64, fetch: usize, read: impl FnMut(Range<u64>) -> Result<Bytes> + 'r) -> Self {
        ImageRun {
            size,
            read: Box::new(read),
            fetch: fetch.max(1) as u64,
            buf: Bytes::new(),
            pos: 0,
            crc: crc32fast::Hasher::new(),
            left: 0,
            key: Vec::new(),
            head: None,
            next_key: Vec::new(),
        }
    }

    /// A run in memory.
    pub fn in_memory(bytes: &'r [u8]) -> Self {
        ImageRun::new(bytes.len() as u64, usize::MAX, move |r| {
            Ok(Bytes::copy_from_slice(&bytes[r.start as usize..r.end as usize]))
        })
    }

    /// Fills `out` with the bytes from `pos` on, fetching as needed.
    pub(super) fn fill(&mut self, out: &mut [u8]) -> Result<()> {
        let mut filled = 0;
        while filled < out.len() {
            if self.buf.is_empty() {
                let to = self.pos.saturating_add(self.fetch).min(self.size);
                self.buf = (self.read)(self.pos..to)?;
                if self.buf.len() as u64 != to - self.pos || to == self.pos {
                    return Err(image_corrupt("shorter than its manifest says"));
                }
                // Hashed as fetched, not field by field (crc32fast's path
                // for 4 to 15 bytes was 0.5% of a replay's CPU): every
                // body byte is fetched once, in order, and read before the
                // CRC is checked (`advance` refuses trailing bytes).
                let body = self.size.saturating_sub(4).saturating_sub(self.pos).min(self.buf.len() as u64);
                self.crc.update(&self.buf[..body as usize]);
            }
            let k = (out.len() - filled).min(self.buf.len());
            // Copied out, then skipped: no reference-counted slice per field.
            out[filled..filled + k].copy_from_slice(&self.buf[..k]);
            bytes::Buf::advance(&mut self.buf, k);
            filled += k;
            self.pos += k as u64;
        }
        Ok(())
    }

    /// Fails unless `n` more bytes of the body (before the CRC) are left.
    pub(super) fn check_room(&self, n: usize) -> Result<()> {
        match self.pos.checked_add(n as u64) {
            Some(end) if end <= self.size.saturating_sub(4) => Ok(()),
            _ => Err(image_corrupt("truncated")),
        }
    }

    /// Fills `out` with the next bytes of the body (hashed by `fill`).
    pub(super) fn take(&mut self, out: &mut [u8]) -> Result<()> {
        self.check_room(out.len())?;
        self.fill(out)
    }

    pub(super) fn u32(&mut self) -> Result<u32> {
        let mut b = [0; 4];
        self.take(&mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    pub(super) fn u64(&mut self) -> Result<u64> {
        let mut b = [0; 8];
        self.take(&mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// Back to the start; reads the header and the first entry.
    pub(super) fn open(&mut self) -> Result<()> {
        self.buf = Bytes::new();
        self.pos = 0;
        self.crc = crc32fast::Hasher::new();
        let mut header = [0; IMAGE_HEADER];
        self.take(&mut header)?;
        let (format, count) = image_header_fields(&header)?;
        if format != IMAGE_FORMAT {
            return Err(image_corrupt(&format!("only images of format {IMAGE_FORMAT} merge, not {format}")));
        }
        self.left = count;
        self.head = None;
        self.advance()
    }

    /// The next entry into the head (keys strictly ascending); past the
    /// last, checks the CRC and that nothing follows it.
    pub(super) fn advance(&mut self) -> Result<()> {
        if self.left == 0 {
            self.head = None;
            if self.pos + 4 != self.size {
                return Err(image_corrupt("trailing bytes"));
            }
            let mut crc = [0; 4];
            self.fill(&mut crc)?;
            let expected = std::mem::replace(&mut self.crc, crc32fast::Hasher::new()).finalize();
            if crc != expected.to_le_bytes() {
                return Err(image_corrupt("checksum mismatch"));
            }
            return Ok(());
        }
        self.left -= 1;
        let len = self.u32()? as usize;
        // Checked before the buffer grows: a corrupt length allocates nothing.
        self.check_room(len)?;
        let mut key = std::mem::take(&mut self.next_key);
        key.resize(len, 0);
        self.take(&mut key)?;
        if self.head.is_some() && self.key >= key {
            return Err(image_corrupt("keys out of order"));
        }
        self.next_key = std::mem::replace(&mut self.key, key);
        let ts = self.u64()?;
        let row = self.u64()?;
        self.head = Some((ts, row));
        Ok(())
    }
}

/// Calls `f` with every key the merge of `runs` keeps, in key order, with
/// its version (ts, row); reads the runs from their start.
pub(super) fn merge_runs(runs: &mut [ImageRun<'_>], mut f: impl FnMut(&[u8], u64, u64) -> Result<()>) -> Result<()> {
    for run in runs.iter_mut() {
        run.open()?;
    }
    let mut key = Vec::new();
    loop {
        // The smallest key at a head; the newest run holding it wins.
        let mut best: Option<usize> = None;
        for (i, run) in runs.iter().enumerate() {
            if run.head.is_some() && best.is_none_or(|b| run.key <= runs[b].key) {
                best = Some(i);
            }
        }
        let Some(winner) = best else { return Ok(()) };
        let (ts, row) = runs[winner].head.ok_or_else(|| Error::invariant("merge head vanished"))?;
        key.clone_from(&runs[winner].key);
        if row != TOMBSTONE {
            f(&key, ts, row)?;
        }
        for run in runs.iter_mut() {
            if run.head.is_some() && run.key == key {
                run.advance()?;
            }
        }
    }
}

pub(super) fn image_corrupt(reason: &str) -> Error {
    Error::Corrupt { what: "index snapshot".into(), reason: reason.into() }
}

/// Checks magic, CRC and format; returns the format, the entry count and a
/// reader at the first entry (over the bytes before the CRC).
pub(super) fn open_image(bytes: &[u8]) -> Result<(u32, usize, Reader<'_>)> {
    if bytes.len() < IMAGE_HEADER + 4 {
        return Err(image_corrupt("too short"));
    }
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    if crc32fast::hash(body).to_le_bytes() != crc {
        return Err(image_corrupt("checksum mismatch"));
    }
    let mut r = Reader { bytes: body, pos: 0 };
    let header = r.take(IMAGE_HEADER).ok_or_else(|| image_corrupt("truncated"))?;
    let (format, n) = image_header_fields(header)?;
    Ok((format, n as usize, r))
}

/// Bytes of an image's header: magic, format (u32), entry count (u64).
pub(super) const IMAGE_HEADER: usize = INDEX_MAGIC.len() + 4 + 8;

/// The format and entry count of an image's header, whose magic and
/// format are checked (formats 1 to 3 are read).
pub(super) fn image_header_fields(header: &[u8]) -> Result<(u32, u64)> {
    let (magic, rest) = header.split_at(INDEX_MAGIC.len());
    if magic != INDEX_MAGIC {
        return Err(image_corrupt("bad magic"));
    }
    let format = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]);
    if ![INDEX_FORMAT, IMAGE_FORMAT_WIDE_INTS, IMAGE_FORMAT].contains(&format) {
        return Err(image_corrupt(&format!("format {format} is not supported (expected 1 to {IMAGE_FORMAT})")));
    }
    let mut count = [0; 8];
    count.copy_from_slice(&rest[4..12]);
    Ok((format, u64::from_le_bytes(count)))
}

pub(super) const INDEX_MAGIC: &[u8; 8] = b"FOVEAIDX";
pub(super) const INDEX_FORMAT: u32 = 1;

pub(super) struct Reader<'a> {
    pub(super) bytes: &'a [u8],
    pub(super) pos: usize,
}

impl<'a> Reader<'a> {
    pub(super) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.bytes.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(s)
    }
    pub(super) fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    pub(super) fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    /// One format-2 entry: key, ts, row.
    pub(super) fn entry(&mut self) -> Result<(&'a [u8], u64, u64)> {
        let truncated = || image_corrupt("truncated entry");
        let klen = self.u32().ok_or_else(truncated)? as usize;
        let key = self.take(klen).ok_or_else(truncated)?;
        let ts = self.u64().ok_or_else(truncated)?;
        let row = self.u64().ok_or_else(truncated)?;
        Ok((key, ts, row))
    }
}
