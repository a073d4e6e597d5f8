//! On-disk framing of one log record.
//!
//! ```text
//! frame  := body_len: u32 LE | crc32(body): u32 LE | body
//! body   := version: u8 (= 1) | txn_id: u64 LE | n: u16 LE | participants: n × u64 LE | payload
//! ```
//! `participants` lists every object a transaction wrote when it wrote more than one, so that
//! recovery can tell a complete multi-table transaction from a torn one. The CRC is checked when
//! writing (by construction) and again on every read.

use eddy_common::{Error, ObjectId, Result, SqlState, TxnId, limits};

pub const FRAME_HEADER_BYTES: usize = 8;
const FORMAT_VERSION: u8 = 1;

/// One record as stored: which transaction wrote it, with whom, and the payload bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub txn_id: TxnId,
    /// Other objects written by the same transaction; empty for single-object transactions.
    pub participants: Vec<ObjectId>,
    pub payload: Vec<u8>,
}

/// Appends the frame of `record` to `out`.
pub fn encode(record: &Record, out: &mut Vec<u8>) -> Result<()> {
    let body_len = 1 + 8 + 2 + 8 * record.participants.len() + record.payload.len();
    if body_len > limits::LOG_RECORD_BYTES_MAX {
        return Err(Error::new(
            SqlState::PROGRAM_LIMIT_EXCEEDED,
            format!(
                "a transaction wrote {body_len} bytes to one table, more than the limit of {} bytes",
                limits::LOG_RECORD_BYTES_MAX
            ),
        ));
    }
    let participants = u16::try_from(record.participants.len()).map_err(|_| {
        Error::new(SqlState::PROGRAM_LIMIT_EXCEEDED, "a transaction wrote to too many tables")
    })?;
    let start = out.len();
    out.extend_from_slice(&(body_len as u32).to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.push(FORMAT_VERSION);
    out.extend_from_slice(&record.txn_id.0.to_le_bytes());
    out.extend_from_slice(&participants.to_le_bytes());
    for p in &record.participants {
        out.extend_from_slice(&p.0.to_le_bytes());
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
        return Err(FrameError::Torn("body shorter than its fixed fields".into()));
    }
    if body[0] != FORMAT_VERSION {
        return Err(FrameError::Torn(format!("unknown record format version {}", body[0])));
    }
    let txn_id = TxnId(u64::from_le_bytes(fixed(&body[1..9])));
    let n = u16::from_le_bytes([body[9], body[10]]) as usize;
    let payload_start = 11 + 8 * n;
    if body.len() < payload_start {
        return Err(FrameError::Torn("participant list overruns the body".into()));
    }
    let participants =
        (0..n).map(|i| ObjectId(u64::from_le_bytes(fixed(&body[11 + 8 * i..19 + 8 * i])))).collect();
    Ok(Record { txn_id, participants, payload: body[payload_start..].to_vec() })
}

fn fixed(bytes: &[u8]) -> [u8; 8] {
    let mut out = [0; 8];
    out.copy_from_slice(bytes);
    out
}

impl From<FrameError> for Error {
    fn from(err: FrameError) -> Self {
        let FrameError::Torn(why) = err;
        Error::new(SqlState::DATA_CORRUPTED, format!("corrupt log record: {why}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_crc_check() {
        let record = Record {
            txn_id: TxnId(42),
            participants: vec![ObjectId(3), ObjectId(9)],
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
}
