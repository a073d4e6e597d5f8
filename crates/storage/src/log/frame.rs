//! On-disk framing of one log record.
//!
//! ```text
//! frame  := body_len: u32 LE | crc32(body): u32 LE | body
//! body   := version: u8 (= 2) | txn_id: u64 LE | n: u16 LE
//!           | participants: n × (object: u64 LE, partition: u32 LE) | payload
//! ```
//! `participants` lists every partition a transaction wrote when it wrote more than one, so
//! that recovery can tell a complete multi-partition transaction from a torn one. Version 1
//! frames (participants as bare object ids, meaning any partition of the object) are still
//! read. The CRC is checked when writing (by construction) and again on every read.

use eddy_common::{Error, ObjectId, PartitionId, Result, SqlState, TxnId, limits};

pub const FRAME_HEADER_BYTES: usize = 8;
const FORMAT_VERSION: u8 = 2;
const FORMAT_VERSION_OBJECTS_ONLY: u8 = 1;

/// A partition written by a multi-partition transaction; `partition` is `None` in records of
/// version 1, which named objects only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Participant {
    pub object: ObjectId,
    pub partition: Option<PartitionId>,
}

/// One record as stored: which transaction wrote it, with whom, and the payload bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub txn_id: TxnId,
    /// Every partition written by the same transaction; empty for single-partition ones.
    pub participants: Vec<Participant>,
    pub payload: Vec<u8>,
}

/// Checks that a record of `payload` bytes naming `participants` partitions fits a frame;
/// returns its body's length.
pub fn check(participants: usize, payload: usize) -> Result<usize> {
    let body_len = 1 + 8 + 2 + 12 * participants + payload;
    if body_len > limits::LOG_RECORD_BYTES_MAX {
        return Err(Error::new(
            SqlState::PROGRAM_LIMIT_EXCEEDED,
            format!(
                "a transaction wrote {body_len} bytes to one table, more than the limit of {} bytes",
                limits::LOG_RECORD_BYTES_MAX
            ),
        ));
    }
    if u16::try_from(participants).is_err() {
        return Err(Error::new(
            SqlState::PROGRAM_LIMIT_EXCEEDED,
            "a transaction wrote to too many tables",
        ));
    }
    Ok(body_len)
}

/// Appends the frame of `record` to `out`.
pub fn encode(record: &Record, out: &mut Vec<u8>) -> Result<()> {
    let body_len = check(record.participants.len(), record.payload.len())?;
    let participants = record.participants.len() as u16;
    let start = out.len();
    out.extend_from_slice(&(body_len as u32).to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.push(FORMAT_VERSION);
    out.extend_from_slice(&record.txn_id.0.to_le_bytes());
    out.extend_from_slice(&participants.to_le_bytes());
    for p in &record.participants {
        let partition = p
            .partition
            .ok_or_else(|| Error::internal("a participant without its partition"))?;
        out.extend_from_slice(&p.object.0.to_le_bytes());
        out.extend_from_slice(&partition.0.to_le_bytes());
    }
    out.extend_from_slice(&record.payload);
    let crc = crc32fast::hash(&out[start + FRAME_HEADER_BYTES..]);
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// What a frame header says: how long the body is and its CRC.
pub struct Header {
    pub body_len: usize,
    pub crc: u32,
}

pub fn decode_header(bytes: &[u8; FRAME_HEADER_BYTES]) -> Header {
    let body_len = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
    let crc = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
    Header { body_len, crc }
}

/// Why a frame could not be read. `Torn` frames at the tail of the last segment are expected
/// after a crash; anywhere else they mean corruption.
#[derive(Debug)]
pub enum FrameError {
    Torn(String),
}

/// Checks the CRC and decodes the body.
pub fn decode_body(header: &Header, body: &[u8]) -> Result<Record, FrameError> {
    if crc32fast::hash(body) != header.crc {
        return Err(FrameError::Torn("CRC mismatch".into()));
    }
    if body.len() < 11 {
        return Err(FrameError::Torn(
            "body shorter than its fixed fields".into(),
        ));
    }
    let width = match body[0] {
        FORMAT_VERSION => 12,
        FORMAT_VERSION_OBJECTS_ONLY => 8,
        other => {
            return Err(FrameError::Torn(format!(
                "unknown record format version {other}"
            )));
        }
    };
    let txn_id = TxnId(u64::from_le_bytes(fixed(&body[1..9])));
    let n = u16::from_le_bytes([body[9], body[10]]) as usize;
    let payload_start = 11 + width * n;
    if body.len() < payload_start {
        return Err(FrameError::Torn(
            "participant list overruns the body".into(),
        ));
    }
    let participants = body[11..payload_start]
        .chunks_exact(width)
        .map(|p| Participant {
            object: ObjectId(u64::from_le_bytes(fixed(&p[..8]))),
            partition: (width == 12).then(|| PartitionId(u32::from_le_bytes(fixed(&p[8..])))),
        })
        .collect();
    Ok(Record {
        txn_id,
        participants,
        payload: body[payload_start..].to_vec(),
    })
}

fn fixed<const N: usize>(bytes: &[u8]) -> [u8; N] {
    let mut out = [0; N];
    out.copy_from_slice(bytes);
    out
}

impl From<FrameError> for Error {
    fn from(err: FrameError) -> Self {
        let FrameError::Torn(why) = err;
        Error::new(
            SqlState::DATA_CORRUPTED,
            format!("corrupt log record: {why}"),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_crc_check() {
        let record = Record {
            txn_id: TxnId(42),
            participants: vec![
                Participant {
                    object: ObjectId(3),
                    partition: Some(PartitionId(0)),
                },
                Participant {
                    object: ObjectId(3),
                    partition: Some(PartitionId(2)),
                },
                Participant {
                    object: ObjectId(9),
                    partition: Some(PartitionId(0)),
                },
            ],
            payload: b"hello".to_vec(),
        };
        let mut buf = Vec::new();
        encode(&record, &mut buf).unwrap();
        let header = decode_header(buf[..8].try_into().unwrap());
        assert_eq!(header.body_len, buf.len() - 8);
        assert_eq!(decode_body(&header, &buf[8..]).unwrap(), record);
        buf[12] ^= 1;
        assert!(decode_body(&header, &buf[8..]).is_err());
    }

    #[test]
    fn version_1_frames_name_objects_only() {
        let mut body = vec![FORMAT_VERSION_OBJECTS_ONLY];
        body.extend_from_slice(&7u64.to_le_bytes());
        body.extend_from_slice(&2u16.to_le_bytes());
        body.extend_from_slice(&3u64.to_le_bytes());
        body.extend_from_slice(&9u64.to_le_bytes());
        body.extend_from_slice(b"rows");
        let header = Header {
            body_len: body.len(),
            crc: crc32fast::hash(&body),
        };
        let record = decode_body(&header, &body).unwrap();
        assert_eq!(record.txn_id, TxnId(7));
        assert_eq!(record.payload, b"rows");
        assert_eq!(
            record.participants,
            vec![
                Participant {
                    object: ObjectId(3),
                    partition: None
                },
                Participant {
                    object: ObjectId(9),
                    partition: None
                }
            ]
        );
    }
}
