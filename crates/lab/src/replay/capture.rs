//! Reading the capture to replay (pcap or pcapng) and writing the output pcap.
//!
//! A replay must never panic on a bad file and must say where the file is bad, so every read
//! error becomes a message naming the file and the record (numbered from 1, as Wireshark
//! numbers frames). Link types other than Ethernet are refused outright: the pipeline parses
//! Ethernet frames, and feeding it anything else would show up as a flood of misleading drops.
//!
//! pcap records are read raw and validated here rather than through
//! `pcap_file::pcap::PcapPacket`, which refuses records whose wire length exceeds the file's
//! snap length — exactly what every capture taken with `tcpdump -s 128` contains. pcapng
//! timestamps are converted with the interface's `if_tsresol` and `if_tsoffset` here because
//! pcap-file 2 reads the raw count as nanoseconds, while the pcapng default is microseconds.

use std::borrow::Cow;
use std::fs::File;
use std::io::{self, BufWriter, Read, Seek};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use pcap_file::pcap::{PcapHeader, PcapReader, PcapWriter, RawPcapPacket};
use pcap_file::pcapng::blocks::interface_description::{
    InterfaceDescriptionBlock, InterfaceDescriptionOption,
};
use pcap_file::pcapng::{Block, PcapNgReader};
use pcap_file::{DataLink, Endianness, PcapError, TsResolution};

const NANOS_PER_SEC: u64 = 1_000_000_000;

/// Snap length written in the output header: libpcap's maximum, so any frame the input held
/// (jumbo frames, GRO'd captures) is written whole.
const OUTPUT_SNAPLEN: u32 = 262_144;

/// What the reader knows about one packet record besides its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordMeta {
    /// Record number, from 1 (Wireshark's frame number).
    pub number: u64,
    /// Capture timestamp in nanoseconds since the Unix epoch.
    pub ts_ns: u64,
    /// Length on the wire: more than the captured bytes when the snap length cut the packet.
    pub orig_len: u32,
}

/// A capture file opened for reading, pcap or pcapng.
pub struct CaptureReader {
    path: PathBuf,
    format: Format,
    /// Packet records returned so far.
    records: u64,
    /// Timestamp of the latest record, given to pcapng simple packets (which carry none).
    last_ts_ns: u64,
}

enum Format {
    Pcap {
        reader: PcapReader<File>,
        /// Nanosecond-resolution pcap (magic `a1b23c4d`) rather than microsecond.
        nanos: bool,
    },
    PcapNg {
        reader: PcapNgReader<File>,
        /// Interfaces of the current section, in the order their descriptions came.
        interfaces: Vec<Interface>,
    },
}

/// The parts of a pcapng interface description a replay needs.
#[derive(Clone, Copy, Debug)]
struct Interface {
    linktype: DataLink,
    unit: TsUnit,
    offset_secs: u64,
}

impl Interface {
    fn from_block(block: &InterfaceDescriptionBlock<'_>) -> Self {
        let mut interface = Interface {
            linktype: block.linktype,
            unit: TsUnit::from_tsresol(6),
            offset_secs: 0,
        };
        for option in &block.options {
            match option {
                InterfaceDescriptionOption::IfTsResol(resol) => {
                    interface.unit = TsUnit::from_tsresol(*resol)
                }
                InterfaceDescriptionOption::IfTsOffset(secs) => interface.offset_secs = *secs,
                _ => {}
            }
        }
        interface
    }

    fn ts_ns(&self, raw: u64) -> Option<u64> {
        self.unit
            .to_ns(raw)?
            .checked_add(self.offset_secs.checked_mul(NANOS_PER_SEC)?)
    }
}

/// A pcapng timestamp unit (`if_tsresol`): 10^-n or 2^-n seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TsUnit {
    Decimal(u8),
    Binary(u8),
}

impl TsUnit {
    fn from_tsresol(resol: u8) -> Self {
        if resol & 0x80 == 0 {
            TsUnit::Decimal(resol)
        } else {
            TsUnit::Binary(resol & 0x7f)
        }
    }

    /// `raw` units in nanoseconds, `None` past what a `u64` of nanoseconds holds (year 2554).
    fn to_ns(self, raw: u64) -> Option<u64> {
        let ns = match self {
            TsUnit::Decimal(exp) if exp <= 9 => u128::from(raw) * 10u128.pow(u32::from(9 - exp)),
            TsUnit::Decimal(exp) => match 10u128.checked_pow(u32::from(exp - 9)) {
                Some(divisor) => u128::from(raw) / divisor,
                None => 0,
            },
            TsUnit::Binary(exp) => (u128::from(raw) * u128::from(NANOS_PER_SEC)) >> exp,
        };
        u64::try_from(ns).ok()
    }
}

/// Says what is wrong in words an operator can act on; pcap-file's own messages ("Need more
/// bytes", "Error reading bytes") do not say that the file was cut short.
/// A length field too large for the reader's 8 MB buffer reads the same as a cut file,
/// hence both causes in the message.
fn describe(error: &PcapError) -> String {
    const CUT: &str = "the file ends in the middle of it (cut short, or a corrupt length field)";
    match error {
        PcapError::IncompleteBuffer => CUT.into(),
        PcapError::IoError(e) if e.kind() == io::ErrorKind::UnexpectedEof => CUT.into(),
        PcapError::IoError(e) => e.to_string(),
        PcapError::InvalidField(what) => format!("invalid field: {what}"),
        other => other.to_string(),
    }
}

fn linktype_error(path: &Path, linktype: DataLink, what: &str) -> anyhow::Error {
    anyhow!(
        "input {}: {what} has link type {linktype:?} ({}); replay needs Ethernet frames \
         (LINKTYPE_ETHERNET / DLT_EN10MB, 1)",
        path.display(),
        u32::from(linktype)
    )
}

/// Reads until `buf` is full or the file ends; returns how many bytes it got.
fn read_up_to(file: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match file.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

const PCAPNG_MAGIC: [u8; 4] = [0x0a, 0x0d, 0x0d, 0x0a];
const PCAP_MAGICS: [u32; 4] = [0xa1b2_c3d4, 0xa1b2_3c4d, 0xd4c3_b2a1, 0x4d3c_b2a1];

impl CaptureReader {
    /// Opens `path`, tells pcap from pcapng by the magic number and reads the file header.
    pub fn open(path: &Path) -> Result<Self> {
        let mut file =
            File::open(path).with_context(|| format!("cannot open input {}", path.display()))?;
        let mut magic = [0u8; 4];
        let got = read_up_to(&mut file, &mut magic)
            .with_context(|| format!("cannot read input {}", path.display()))?;
        if got == 0 {
            bail!(
                "input {} is empty: not a pcap or pcapng capture",
                path.display()
            );
        }
        file.rewind()
            .with_context(|| format!("cannot read input {}", path.display()))?;
        let format = if magic == PCAPNG_MAGIC {
            let reader = PcapNgReader::new(file).map_err(|e| {
                anyhow!(
                    "input {}: cannot read the pcapng section header: {}",
                    path.display(),
                    describe(&e)
                )
            })?;
            Format::PcapNg {
                reader,
                interfaces: Vec::new(),
            }
        } else if got == 4 && PCAP_MAGICS.contains(&u32::from_be_bytes(magic)) {
            let reader = PcapReader::new(file).map_err(|e| {
                anyhow!(
                    "input {}: cannot read the pcap file header: {}",
                    path.display(),
                    describe(&e)
                )
            })?;
            let header = reader.header();
            if header.datalink != DataLink::ETHERNET {
                return Err(linktype_error(path, header.datalink, "the capture"));
            }
            Format::Pcap {
                reader,
                nanos: header.ts_resolution == TsResolution::NanoSecond,
            }
        } else {
            let start: String = magic[..got].iter().map(|b| format!("{b:02x}")).collect();
            bail!(
                "input {}: not a pcap or pcapng capture (it starts with 0x{start})",
                path.display()
            );
        };
        Ok(CaptureReader {
            path: path.to_path_buf(),
            format,
            records: 0,
            last_ts_ns: 0,
        })
    }

    /// Reads the next packet record into `buf` (replacing its contents, reusing its memory).
    /// `Ok(None)` at the end of the file; an error names the record that could not be read.
    pub fn next_into(&mut self, buf: &mut Vec<u8>) -> Result<Option<RecordMeta>> {
        let CaptureReader {
            path,
            format,
            records,
            last_ts_ns,
        } = self;
        let number = *records + 1;
        let (ts_ns, orig_len) = match format {
            Format::Pcap { reader, nanos } => {
                let Some(raw) = reader.next_raw_packet() else {
                    return Ok(None);
                };
                let raw = raw.map_err(|e| {
                    anyhow!(
                        "input {}: record {number}: {}",
                        path.display(),
                        describe(&e)
                    )
                })?;
                let (limit, scale) = if *nanos {
                    (NANOS_PER_SEC, 1)
                } else {
                    (1_000_000, 1_000)
                };
                if u64::from(raw.ts_frac) >= limit {
                    bail!(
                        "input {}: record {number}: timestamp fraction {} is out of range",
                        path.display(),
                        raw.ts_frac
                    );
                }
                let ts_ns = u64::from(raw.ts_sec) * NANOS_PER_SEC + u64::from(raw.ts_frac) * scale;
                buf.clear();
                buf.extend_from_slice(&raw.data);
                (ts_ns, raw.orig_len)
            }
            Format::PcapNg { reader, interfaces } => loop {
                let Some(block) = reader.next_block() else {
                    return Ok(None);
                };
                let block = block.map_err(|e| {
                    anyhow!(
                        "input {}: block after record {}: {}",
                        path.display(),
                        number - 1,
                        describe(&e)
                    )
                })?;
                // (interface id, raw timestamp or None for "no timestamp", wire length, bytes)
                let (interface_id, raw_ts, orig_len, data) = match &block {
                    Block::SectionHeader(_) => {
                        interfaces.clear();
                        continue;
                    }
                    Block::InterfaceDescription(idb) => {
                        interfaces.push(Interface::from_block(idb));
                        continue;
                    }
                    Block::EnhancedPacket(epb) => (
                        epb.interface_id,
                        // pcap-file stored the raw count as if it were nanoseconds.
                        Some(epb.timestamp.as_nanos() as u64),
                        epb.original_len,
                        &epb.data,
                    ),
                    Block::Packet(pb) => (
                        u32::from(pb.interface_id),
                        Some(pb.timestamp),
                        pb.original_len,
                        &pb.data,
                    ),
                    Block::SimplePacket(spb) => (0, None, spb.original_len, &spb.data),
                    _ => continue,
                };
                let Some(interface) = interfaces.get(interface_id as usize) else {
                    bail!(
                        "input {}: record {number}: interface {interface_id} has no \
                         interface description block before it",
                        path.display()
                    );
                };
                if interface.linktype != DataLink::ETHERNET {
                    return Err(linktype_error(
                        path,
                        interface.linktype,
                        &format!("record {number} (interface {interface_id})"),
                    ));
                }
                let ts_ns = match raw_ts {
                    Some(raw) => interface.ts_ns(raw).ok_or_else(|| {
                        anyhow!(
                            "input {}: record {number}: timestamp is out of range",
                            path.display()
                        )
                    })?,
                    None => *last_ts_ns,
                };
                buf.clear();
                buf.extend_from_slice(data);
                break (ts_ns, orig_len);
            },
        };
        *records = number;
        *last_ts_ns = ts_ns;
        Ok(Some(RecordMeta {
            number,
            ts_ns,
            orig_len,
        }))
    }
}

/// The output pcap: Ethernet, nanosecond timestamps, so input timestamps carry over exactly.
pub struct CaptureWriter {
    path: PathBuf,
    writer: PcapWriter<BufWriter<File>>,
    written: u64,
}

impl CaptureWriter {
    pub fn create(path: &Path) -> Result<Self> {
        let file = File::create(path)
            .with_context(|| format!("cannot create output {}", path.display()))?;
        let header = PcapHeader {
            version_major: 2,
            version_minor: 4,
            ts_correction: 0,
            ts_accuracy: 0,
            snaplen: OUTPUT_SNAPLEN,
            datalink: DataLink::ETHERNET,
            ts_resolution: TsResolution::NanoSecond,
            endianness: Endianness::native(),
        };
        let writer = PcapWriter::with_header(BufWriter::new(file), header)
            .map_err(|e| anyhow!("cannot write output {}: {}", path.display(), describe(&e)))?;
        Ok(CaptureWriter {
            path: path.to_path_buf(),
            writer,
            written: 0,
        })
    }

    /// Writes `data` with the timestamp of the input record it came from.
    pub fn write(&mut self, meta: &RecordMeta, data: &[u8]) -> Result<()> {
        let ts_sec = u32::try_from(meta.ts_ns / NANOS_PER_SEC).map_err(|_| {
            anyhow!(
                "output {}: record {}: its timestamp is past what pcap can hold (year 2106)",
                self.path.display(),
                meta.number
            )
        })?;
        let len = u32::try_from(data.len()).expect("a frame read from a capture fits in u32");
        let packet = RawPcapPacket {
            ts_sec,
            ts_frac: (meta.ts_ns % NANOS_PER_SEC) as u32,
            incl_len: len,
            orig_len: meta.orig_len.max(len),
            data: Cow::Borrowed(data),
        };
        self.writer.write_raw_packet(&packet).map_err(|e| {
            anyhow!(
                "cannot write output {}: {}",
                self.path.display(),
                describe(&e)
            )
        })?;
        self.written += 1;
        Ok(())
    }

    /// Packets written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Flushes the file, so a full disk is an error here rather than a silently short file.
    pub fn finish(self) -> Result<()> {
        let path = self.path;
        self.writer
            .into_writer()
            .into_inner()
            .map_err(|e| e.into_error())
            .and_then(|file| file.sync_all())
            .with_context(|| format!("cannot write output {}", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
    use pcap_file::pcapng::PcapNgWriter;
    use std::time::Duration;

    fn frames() -> Vec<Vec<u8>> {
        (0..4u8).map(|i| vec![i; 60 + usize::from(i)]).collect()
    }

    fn write_pcap(path: &Path, datalink: DataLink, frames: &[Vec<u8>]) {
        let header = PcapHeader {
            datalink,
            ..Default::default()
        };
        let mut w = PcapWriter::with_header(File::create(path).unwrap(), header).unwrap();
        for (i, f) in frames.iter().enumerate() {
            let ts = Duration::new(1_700_000_000 + i as u64, 250_000);
            w.write_packet(&pcap_file::pcap::PcapPacket::new(ts, f.len() as u32, f))
                .unwrap();
        }
    }

    fn read_all(path: &Path) -> Result<Vec<(RecordMeta, Vec<u8>)>> {
        let mut reader = CaptureReader::open(path)?;
        let mut out = Vec::new();
        let mut buf = Vec::new();
        while let Some(meta) = reader.next_into(&mut buf)? {
            out.push((meta, buf.clone()));
        }
        Ok(out)
    }

    #[test]
    fn pcap_records_come_back_with_numbers_and_nanosecond_timestamps() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.pcap");
        write_pcap(&path, DataLink::ETHERNET, &frames());
        let records = read_all(&path).unwrap();
        assert_eq!(records.len(), 4);
        for (i, (meta, data)) in records.iter().enumerate() {
            assert_eq!(meta.number, i as u64 + 1);
            assert_eq!(
                meta.ts_ns,
                (1_700_000_000 + i as u64) * NANOS_PER_SEC + 250_000
            );
            assert_eq!(data, &frames()[i]);
        }
    }

    #[test]
    fn a_cut_capture_is_an_error_naming_the_record_at_every_cut() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.pcap");
        write_pcap(&path, DataLink::ETHERNET, &frames());
        let whole = std::fs::read(&path).unwrap();
        let cut_path = dir.path().join("cut.pcap");
        for cut in 0..whole.len() {
            std::fs::write(&cut_path, &whole[..cut]).unwrap();
            match read_all(&cut_path) {
                Ok(records) => {
                    // Only a cut exactly on a record boundary reads cleanly.
                    let boundary: usize =
                        24 + records.iter().map(|(_, d)| 16 + d.len()).sum::<usize>();
                    assert_eq!(cut, boundary, "cut at {cut} read {} records", records.len());
                }
                Err(e) => {
                    let msg = format!("{e:#}");
                    assert!(msg.contains("cut.pcap"), "{msg}");
                    if cut >= 24 {
                        assert!(msg.contains("record "), "cut at {cut}: {msg}");
                        assert!(msg.contains("cut short"), "cut at {cut}: {msg}");
                    }
                }
            }
        }
    }

    #[test]
    fn other_link_types_and_other_files_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sll.pcap");
        write_pcap(&path, DataLink::LINUX_SLL, &frames());
        let msg = format!("{:#}", CaptureReader::open(&path).err().unwrap());
        assert!(msg.contains("LINUX_SLL (113)"), "{msg}");
        let text = dir.path().join("notes.txt");
        std::fs::write(&text, "hello").unwrap();
        let msg = format!("{:#}", CaptureReader::open(&text).err().unwrap());
        assert!(msg.contains("not a pcap or pcapng capture"), "{msg}");
    }

    fn write_pcapng(path: &Path, tsresol: Option<u8>, raw_ts: &[u64]) {
        let mut w = PcapNgWriter::new(File::create(path).unwrap()).unwrap();
        let options = tsresol
            .map(|r| vec![InterfaceDescriptionOption::IfTsResol(r)])
            .unwrap_or_default();
        w.write_pcapng_block(InterfaceDescriptionBlock {
            linktype: DataLink::ETHERNET,
            snaplen: 0,
            options,
        })
        .unwrap();
        for (i, raw) in raw_ts.iter().enumerate() {
            let data = frames()[i].clone();
            w.write_pcapng_block(EnhancedPacketBlock {
                interface_id: 0,
                // pcap-file writes the nanosecond count as the raw value.
                timestamp: Duration::from_nanos(*raw),
                original_len: data.len() as u32,
                data: Cow::Owned(data),
                options: vec![],
            })
            .unwrap();
        }
    }

    #[test]
    fn pcapng_timestamps_follow_the_interface_resolution() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.pcapng");
        // No if_tsresol: microseconds.
        write_pcapng(&path, None, &[1_700_000_000_000_001]);
        let records = read_all(&path).unwrap();
        assert_eq!(records[0].0.ts_ns, 1_700_000_000_000_001_000);
        assert_eq!(records[0].1, frames()[0]);
        write_pcapng(&path, Some(9), &[5, 7]);
        let records = read_all(&path).unwrap();
        assert_eq!(
            records.iter().map(|r| r.0.ts_ns).collect::<Vec<_>>(),
            [5, 7]
        );
        assert_eq!(
            TsUnit::from_tsresol(0x80 | 10).to_ns(1024),
            Some(NANOS_PER_SEC)
        );
        assert_eq!(TsUnit::from_tsresol(12).to_ns(5_000), Some(5));
        assert_eq!(TsUnit::from_tsresol(120).to_ns(u64::MAX), Some(0));
    }
}
