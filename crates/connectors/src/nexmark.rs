//! The Nexmark benchmark generator (`connector = 'nexmark'`), producing Arrow batches directly.
//!
//! It follows the standard generator (nexmark-flink's `NexmarkGenerator`, itself from Apache
//! Beam): event ids are split into epochs of 50 — 1 person, 3 auctions, 46 bids; ids start at
//! 1000, categories at 10 (5 of them); hot auctions / sellers / bidders with ratios 2 / 4 / 4
//! (the hot one is the first of the last 100); 100 auctions in flight and 1000 active people;
//! prices `round(10^(U*6) * 100)` cents; `extra` pads each event to the average sizes (person
//! 200, auction 500, bid 100 bytes); the event time of event `e` is
//! `base + e * 1e6 / events_per_second` µs, truncated to milliseconds (not the wall clock).
//!
//! Every event draws its random values from a generator seeded by (seed, event id), so any
//! event can be generated alone: a table or source split over N partitions generates event ids
//! `p, p + N, p + 2N, ...` in partition `p`, a restart resumes at any position with the same
//! events, and the person, auction and bid tables (separate readers of the same sequence)
//! agree on the ids they refer to. The PRNG is SplitMix64, written out here so that the
//! sequence never changes with a dependency's version.

use std::sync::Arc;

use arrow::array::{
    ArrayRef, Int64Builder, RecordBatch, RecordBatchOptions, StringBuilder,
    TimestampMicrosecondBuilder,
};
use arrow::datatypes::{DataType, Field, SchemaRef, TimeUnit};
use eddy_common::{Error, Result, SqlState};

const PERSON_PROPORTION: u64 = 1;
const AUCTION_PROPORTION: u64 = 3;
const BID_PROPORTION: u64 = 46;
const TOTAL_PROPORTION: u64 = PERSON_PROPORTION + AUCTION_PROPORTION + BID_PROPORTION;

const FIRST_PERSON_ID: i64 = 1000;
const FIRST_AUCTION_ID: i64 = 1000;
const FIRST_CATEGORY_ID: i64 = 10;
const NUM_CATEGORIES: u64 = 5;
const HOT_AUCTION_RATIO: u64 = 2;
const HOT_SELLERS_RATIO: u64 = 4;
const HOT_BIDDERS_RATIO: u64 = 4;
/// The hot one is the first of the last this many.
const HOT_GROUP: u64 = 100;
const NUM_IN_FLIGHT_AUCTIONS: u64 = 100;
const NUM_ACTIVE_PEOPLE: u64 = 1000;
const PERSON_ID_LEAD: u64 = 10;
const AVG_PERSON_BYTES: usize = 200;
const AVG_AUCTION_BYTES: usize = 500;
const AVG_BID_BYTES: usize = 100;
/// One bid in this many goes to a channel other than the four hot ones.
const HOT_CHANNELS_RATIO: u64 = 100;
const CHANNELS_NUMBER: u64 = 10_000;
const MIN_STRING_LENGTH: u64 = 3;
/// The event-time rate when the generator runs as fast as it can (nexmark-flink's default).
pub const DEFAULT_EVENT_RATE: u64 = 10_000_000;
/// 2015-07-15 00:00:00 UTC, in ms: the event time of event 0 unless `nexmark.base.time` says.
pub const DEFAULT_BASE_TIME_MS: i64 = 1_436_918_400_000;

const US_STATES: [&str; 6] = ["AZ", "CA", "ID", "OR", "WA", "WY"];
const US_CITIES: [&str; 10] = [
    "Phoenix",
    "Los Angeles",
    "San Francisco",
    "Boise",
    "Portland",
    "Bend",
    "Redmond",
    "Seattle",
    "Kent",
    "Cheyenne",
];
const FIRST_NAMES: [&str; 11] = [
    "Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter",
];
const LAST_NAMES: [&str; 9] = [
    "Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris",
];
const HOT_CHANNELS: [&str; 4] = ["Google", "Facebook", "Baidu", "Apple"];
const HOT_URLS: [&str; 4] = [
    "https://www.nexmark.com/googl/item.htm?query=1",
    "https://www.nexmark.com/meta/item.htm?query=1",
    "https://www.nexmark.com/bidu/item.htm?query=1",
    "https://www.nexmark.com/aapl/item.htm?query=1",
];

/// Which of the three streams a table or source carries (`nexmark.table.type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Person,
    Auction,
    Bid,
}

impl EventKind {
    pub fn parse(name: &str) -> Result<EventKind> {
        match name.to_ascii_lowercase().as_str() {
            "person" => Ok(EventKind::Person),
            "auction" => Ok(EventKind::Auction),
            "bid" => Ok(EventKind::Bid),
            other => Err(Error::invalid_parameter(format!(
                "nexmark.table.type must be 'person', 'auction' or 'bid', not '{other}'"
            ))),
        }
    }

    /// The kind of global event `id`.
    fn of(id: u64) -> EventKind {
        match id % TOTAL_PROPORTION {
            r if r < PERSON_PROPORTION => EventKind::Person,
            r if r < PERSON_PROPORTION + AUCTION_PROPORTION => EventKind::Auction,
            _ => EventKind::Bid,
        }
    }

    /// The standard columns, in order (RisingWave's names).
    pub fn columns(self) -> &'static [(&'static str, Column)] {
        use Column::*;
        match self {
            EventKind::Person => &[
                ("id", Int),
                ("name", Text),
                ("email_address", Text),
                ("credit_card", Text),
                ("city", Text),
                ("state", Text),
                ("date_time", Time),
                ("extra", Text),
            ],
            EventKind::Auction => &[
                ("id", Int),
                ("item_name", Text),
                ("description", Text),
                ("initial_bid", Int),
                ("reserve", Int),
                ("date_time", Time),
                ("expires", Time),
                ("seller", Int),
                ("category", Int),
                ("extra", Text),
            ],
            EventKind::Bid => &[
                ("auction", Int),
                ("bidder", Int),
                ("price", Int),
                ("channel", Text),
                ("url", Text),
                ("date_time", Time),
                ("extra", Text),
            ],
        }
    }
}

/// The type of a standard column: BIGINT, a text type, or TIMESTAMP (without time zone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Column {
    Int,
    Text,
    Time,
}

impl Column {
    fn accepts(self, data_type: &DataType) -> bool {
        match self {
            Column::Int => *data_type == DataType::Int64,
            Column::Text => *data_type == DataType::Utf8,
            Column::Time => matches!(data_type, DataType::Timestamp(TimeUnit::Microsecond, None)),
        }
    }

    fn sql(self) -> &'static str {
        match self {
            Column::Int => "BIGINT",
            Column::Text => "VARCHAR",
            Column::Time => "TIMESTAMP",
        }
    }
}

/// What the generator of one table or source produces.
#[derive(Debug, Clone, Copy)]
pub struct NexmarkConfig {
    pub kind: EventKind,
    pub seed: u64,
    /// Events (of all kinds) per second of event time.
    pub event_rate: u64,
    /// Events of all kinds in the whole run (`nexmark.event.num`); `None`: unlimited.
    pub event_num: Option<u64>,
    pub base_time_ms: i64,
    /// How many partitions the event ids are split over.
    pub splits: u32,
}

/// The generator of one partition (`split`) of a table or source.
pub struct NexmarkGenerator {
    config: NexmarkConfig,
    split: u32,
    schema: SchemaRef,
    /// For each table column, the standard column it is.
    columns: Vec<usize>,
}

/// One generated event's values (the columns of its kind, in the standard order).
enum Value<'a> {
    Int(i64),
    Text(&'a str),
    Time(i64),
}

impl NexmarkGenerator {
    /// A generator for `schema`, whose columns must be standard columns of `config.kind` with
    /// their types (any subset, in any order).
    pub fn new(config: NexmarkConfig, schema: SchemaRef, split: u32) -> Result<NexmarkGenerator> {
        let standard = config.kind.columns();
        let columns = schema
            .fields()
            .iter()
            .map(|f| {
                let (i, (_, column)) = standard
                    .iter()
                    .enumerate()
                    .find(|(_, (name, _))| *name == f.name())
                    .ok_or_else(|| {
                        let names: Vec<&str> = standard.iter().map(|(n, _)| *n).collect();
                        Error::new(
                            SqlState::INVALID_TABLE_DEFINITION,
                            format!(
                                "column \"{}\" is not a Nexmark {:?} field ({})",
                                f.name(),
                                config.kind,
                                names.join(", ")
                            )
                            .to_lowercase(),
                        )
                    })?;
                if !column.accepts(f.data_type()) {
                    return Err(Error::new(
                        SqlState::DATATYPE_MISMATCH,
                        format!("Nexmark column \"{}\" must be {}", f.name(), column.sql()),
                    ));
                }
                Ok(i)
            })
            .collect::<Result<Vec<_>>>()?;
        if config.splits == 0 || split >= config.splits {
            return Err(Error::internal("nexmark split out of range"));
        }
        Ok(NexmarkGenerator {
            config,
            split,
            schema,
            columns,
        })
    }

    /// How many positions (event ids of this split, of every kind) the run has; `None`:
    /// unlimited.
    pub fn end(&self) -> Option<u64> {
        let n = self.config.event_num?;
        let (split, splits) = (u64::from(self.split), u64::from(self.config.splits));
        Some(if n > split {
            (n - split).div_ceil(splits)
        } else {
            0
        })
    }

    /// The global event id at a position of this split.
    fn event_id(&self, position: u64) -> u64 {
        position * u64::from(self.config.splits) + u64::from(self.split)
    }

    /// The event time of the event at `position`, in µs since the epoch.
    pub fn event_time_micros(&self, position: u64) -> i64 {
        self.timestamp_ms(self.event_id(position)) * 1000
    }

    /// Event time of global event `id`, in ms.
    fn timestamp_ms(&self, id: u64) -> i64 {
        let delay_us = 1_000_000.0 / self.config.event_rate.max(1) as f64;
        self.config.base_time_ms + ((delay_us * id as f64) as u64 / 1000) as i64
    }

    /// The rows of the events at positions `from..` (at most `positions` of them, fewer at the
    /// end of a finite run), and the position after them. Events of other kinds are skipped.
    pub fn generate(&self, from: u64, positions: u64) -> Result<(RecordBatch, u64)> {
        let until = self
            .end()
            .map_or(from.saturating_add(positions), |end| {
                end.min(from.saturating_add(positions))
            })
            .max(from);
        let capacity = match self.config.kind {
            EventKind::Bid => (until - from) as usize,
            _ => ((until - from) / 10) as usize + 1,
        };
        let mut builders = Builders::new(self.config.kind, capacity);
        let mut scratch = Scratch::default();
        for position in from..until {
            let id = self.event_id(position);
            if EventKind::of(id) != self.config.kind {
                continue;
            }
            let mut rng = SplitMix64::for_event(self.config.seed, id);
            match self.config.kind {
                EventKind::Person => self.person(id, &mut rng, &mut scratch, &mut builders),
                EventKind::Auction => self.auction(id, &mut rng, &mut scratch, &mut builders),
                EventKind::Bid => self.bid(id, &mut rng, &mut scratch, &mut builders),
            }
        }
        let rows = builders.rows;
        let all = builders.finish();
        let columns: Vec<ArrayRef> = self.columns.iter().map(|&i| Arc::clone(&all[i])).collect();
        let options = RecordBatchOptions::new().with_row_count(Some(rows));
        let batch = RecordBatch::try_new_with_options(Arc::clone(&self.schema), columns, &options)
            .map_err(|e| Error::internal(format!("nexmark batch: {e}")))?;
        Ok((batch, until))
    }

    fn person(&self, id: u64, rng: &mut SplitMix64, s: &mut Scratch, out: &mut Builders) {
        let person = last_base0_person_id(id) as i64 + FIRST_PERSON_ID;
        s.name.clear();
        s.name
            .push_str(FIRST_NAMES[rng.below(FIRST_NAMES.len() as u64) as usize]);
        s.name.push(' ');
        s.name
            .push_str(LAST_NAMES[rng.below(LAST_NAMES.len() as u64) as usize]);
        s.a.clear();
        next_string(rng, 7, &mut s.a);
        s.a.push('@');
        next_string(rng, 5, &mut s.a);
        s.a.push_str(".com");
        s.b.clear();
        for group in 0..4 {
            if group > 0 {
                s.b.push(' ');
            }
            push_padded(&mut s.b, rng.below(10_000));
        }
        let city = US_CITIES[rng.below(US_CITIES.len() as u64) as usize];
        let state = US_STATES[rng.below(US_STATES.len() as u64) as usize];
        let size = 8 + s.name.len() + s.a.len() + s.b.len() + city.len() + state.len();
        s.extra.clear();
        next_extra(rng, size, AVG_PERSON_BYTES, &mut s.extra);
        let time = self.timestamp_ms(id) * 1000;
        out.push(&[
            Value::Int(person),
            Value::Text(&s.name),
            Value::Text(&s.a),
            Value::Text(&s.b),
            Value::Text(city),
            Value::Text(state),
            Value::Time(time),
            Value::Text(&s.extra),
        ]);
    }

    fn auction(&self, id: u64, rng: &mut SplitMix64, s: &mut Scratch, out: &mut Builders) {
        let auction = last_base0_auction_id(id) as i64 + FIRST_AUCTION_ID;
        let seller = if rng.below(HOT_SELLERS_RATIO) > 0 {
            (last_base0_person_id(id) / HOT_GROUP) * HOT_GROUP
        } else {
            next_base0_person_id(id, rng)
        };
        let category = FIRST_CATEGORY_ID + rng.below(NUM_CATEGORIES) as i64;
        let initial_bid = next_price(rng);
        let time_ms = self.timestamp_ms(id);
        // The auction lasts about as long as it takes for 100 more auctions to be generated.
        let events_for_auctions = NUM_IN_FLIGHT_AUCTIONS * TOTAL_PROPORTION / AUCTION_PROPORTION;
        let horizon = (self.timestamp_ms(id + events_for_auctions) - time_ms).max(0) as u64;
        let length_ms = 1 + rng.below((horizon * 2).max(1)) as i64;
        s.a.clear();
        next_string(rng, 20, &mut s.a);
        s.b.clear();
        next_string(rng, 100, &mut s.b);
        let reserve = initial_bid + next_price(rng);
        let size = 8 + s.a.len() + s.b.len() + 8 * 5;
        s.extra.clear();
        next_extra(rng, size, AVG_AUCTION_BYTES, &mut s.extra);
        out.push(&[
            Value::Int(auction),
            Value::Text(&s.a),
            Value::Text(&s.b),
            Value::Int(initial_bid),
            Value::Int(reserve),
            Value::Time(time_ms * 1000),
            Value::Time((time_ms + length_ms) * 1000),
            Value::Int(seller as i64 + FIRST_PERSON_ID),
            Value::Int(category),
            Value::Text(&s.extra),
        ]);
    }

    fn bid(&self, id: u64, rng: &mut SplitMix64, s: &mut Scratch, out: &mut Builders) {
        let auction = if rng.below(HOT_AUCTION_RATIO) > 0 {
            (last_base0_auction_id(id) / HOT_GROUP) * HOT_GROUP
        } else {
            next_base0_auction_id(id, rng)
        };
        // The second of the batch, so that hot bidders and hot sellers differ.
        let bidder = if rng.below(HOT_BIDDERS_RATIO) > 0 {
            (last_base0_person_id(id) / HOT_GROUP) * HOT_GROUP + 1
        } else {
            next_base0_person_id(id, rng)
        };
        let price = next_price(rng);
        let channel_number = rng.below(CHANNELS_NUMBER);
        let (channel, url): (&str, &str) = if rng.below(HOT_CHANNELS_RATIO) > 0 {
            let hot = rng.below(HOT_CHANNELS.len() as u64) as usize;
            (HOT_CHANNELS[hot], HOT_URLS[hot])
        } else {
            channel_instance(channel_number, &mut s.a, &mut s.b);
            (&s.a, &s.b)
        };
        let mut extra = std::mem::take(&mut s.extra);
        extra.clear();
        next_extra(rng, 8 * 4, AVG_BID_BYTES, &mut extra);
        out.push(&[
            Value::Int(auction as i64 + FIRST_AUCTION_ID),
            Value::Int(bidder as i64 + FIRST_PERSON_ID),
            Value::Int(price),
            Value::Text(channel),
            Value::Text(url),
            Value::Time(self.timestamp_ms(id) * 1000),
            Value::Text(&extra),
        ]);
        s.extra = extra;
    }
}

/// Reused string buffers (no allocation per event).
#[derive(Default)]
struct Scratch {
    name: String,
    a: String,
    b: String,
    extra: String,
}

/// Column builders for every standard column of a kind.
struct Builders {
    ints: Vec<Int64Builder>,
    texts: Vec<StringBuilder>,
    times: Vec<TimestampMicrosecondBuilder>,
    /// For each standard column: (its builder list, index in it).
    slots: Vec<(Column, usize)>,
    rows: usize,
}

impl Builders {
    fn new(kind: EventKind, capacity: usize) -> Builders {
        let mut b = Builders {
            ints: Vec::new(),
            texts: Vec::new(),
            times: Vec::new(),
            slots: Vec::new(),
            rows: 0,
        };
        for (_, column) in kind.columns() {
            let slot = match column {
                Column::Int => {
                    b.ints.push(Int64Builder::with_capacity(capacity));
                    b.ints.len() - 1
                }
                Column::Text => {
                    b.texts
                        .push(StringBuilder::with_capacity(capacity, capacity * 16));
                    b.texts.len() - 1
                }
                Column::Time => {
                    b.times
                        .push(TimestampMicrosecondBuilder::with_capacity(capacity));
                    b.times.len() - 1
                }
            };
            b.slots.push((*column, slot));
        }
        b
    }

    fn push(&mut self, values: &[Value<'_>]) {
        for ((_, slot), value) in self.slots.iter().zip(values) {
            match value {
                Value::Int(v) => self.ints[*slot].append_value(*v),
                Value::Text(v) => self.texts[*slot].append_value(v),
                Value::Time(v) => self.times[*slot].append_value(*v),
            }
        }
        self.rows += 1;
    }

    fn finish(mut self) -> Vec<ArrayRef> {
        self.slots
            .iter()
            .map(|(column, slot)| match column {
                Column::Int => Arc::new(self.ints[*slot].finish()) as ArrayRef,
                Column::Text => Arc::new(self.texts[*slot].finish()) as ArrayRef,
                Column::Time => Arc::new(self.times[*slot].finish()) as ArrayRef,
            })
            .collect()
    }
}

/// The standard schema of a kind (for tests and the benchmark's batch comparison).
pub fn standard_fields(kind: EventKind) -> Vec<Field> {
    kind.columns()
        .iter()
        .map(|(name, column)| {
            let data_type = match column {
                Column::Int => DataType::Int64,
                Column::Text => DataType::Utf8,
                Column::Time => DataType::Timestamp(TimeUnit::Microsecond, None),
            };
            Field::new(*name, data_type, true)
        })
        .collect()
}

/// The last person id generated at or before event `id` (0-based).
fn last_base0_person_id(id: u64) -> u64 {
    let epoch = id / TOTAL_PROPORTION;
    let offset = id % TOTAL_PROPORTION;
    // Past the people of this epoch: the last of them.
    let offset = if offset < PERSON_PROPORTION {
        offset
    } else {
        PERSON_PROPORTION - 1
    };
    epoch * PERSON_PROPORTION + offset
}

/// The last auction id generated at or before event `id` (0-based).
fn last_base0_auction_id(id: u64) -> u64 {
    let mut epoch = id / TOTAL_PROPORTION;
    let mut offset = id % TOTAL_PROPORTION;
    if offset < PERSON_PROPORTION {
        // About to generate a person: the last auction of the previous epoch.
        let Some(previous) = epoch.checked_sub(1) else {
            return 0;
        };
        epoch = previous;
        offset = AUCTION_PROPORTION - 1;
    } else if offset >= PERSON_PROPORTION + AUCTION_PROPORTION {
        offset = AUCTION_PROPORTION - 1;
    } else {
        offset -= PERSON_PROPORTION;
    }
    epoch * AUCTION_PROPORTION + offset
}

/// A person among the active ones, or a few ahead of the last one generated.
fn next_base0_person_id(id: u64, rng: &mut SplitMix64) -> u64 {
    let people = last_base0_person_id(id) + 1;
    let active = people.min(NUM_ACTIVE_PEOPLE);
    people - active + rng.below(active + PERSON_ID_LEAD)
}

/// An auction among those likely to be in flight.
fn next_base0_auction_id(id: u64, rng: &mut SplitMix64) -> u64 {
    let max = last_base0_auction_id(id);
    let min = max.saturating_sub(NUM_IN_FLIGHT_AUCTIONS);
    min + rng.below(max - min + 1)
}

fn next_price(rng: &mut SplitMix64) -> i64 {
    (10f64.powf(rng.unit() * 6.0) * 100.0).round() as i64
}

/// 3 to `max - 1` characters, lowercase letters and (one in 13) spaces, trimmed.
fn next_string(rng: &mut SplitMix64, max: u64, out: &mut String) {
    let len = MIN_STRING_LENGTH + rng.below(max - MIN_STRING_LENGTH);
    let start = out.len();
    for _ in 0..len {
        if rng.below(13) == 0 {
            out.push(' ');
        } else {
            out.push(char::from(b'a' + rng.below(26) as u8));
        }
    }
    let trimmed = out[start..].trim();
    if trimmed.len() != len as usize {
        let trimmed = trimmed.to_owned();
        out.truncate(start);
        out.push_str(&trimmed);
    }
}

/// Padding that brings an event of `size` bytes to `average` on average (±20%).
fn next_extra(rng: &mut SplitMix64, size: usize, average: usize, out: &mut String) {
    if size > average {
        return;
    }
    let rest = average - size;
    let delta = (rest as f64 * 0.2).round() as u64;
    let len = rest as u64 - delta + if delta == 0 { 0 } else { rng.below(2 * delta) };
    out.reserve(len as usize);
    for _ in 0..len {
        out.push(char::from(b'a' + rng.below(26) as u8));
    }
}

/// A cold channel: its name and URL, the same for a channel number every time.
fn channel_instance(number: u64, name: &mut String, url: &mut String) {
    let mut rng = SplitMix64::new(number);
    name.clear();
    name.push_str("channel-");
    push_number(name, number);
    url.clear();
    url.push_str("https://www.nexmark.com/");
    next_string(&mut rng, 5, url);
    url.push_str("/item.htm?query=1");
    if rng.below(10) > 0 {
        url.push_str("&channel_id=");
        push_number(url, u64::from((number as u32).reverse_bits()));
    }
}

fn push_number(out: &mut String, n: u64) {
    use std::fmt::Write;
    let _ = write!(out, "{n}");
}

fn push_padded(out: &mut String, n: u64) {
    use std::fmt::Write;
    let _ = write!(out, "{n:04}");
}

/// SplitMix64 (Steele, Lea, Flood 2014): small, fast, and fixed forever here.
struct SplitMix64(u64);

impl SplitMix64 {
    fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The generator of one event: independent of every other event's.
    fn for_event(seed: u64, id: u64) -> Self {
        let mut rng = SplitMix64(seed ^ id.wrapping_mul(0xD1B5_4A32_D192_ED03));
        rng.next_u64();
        rng
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n` > 0), by Lemire's multiply-shift.
    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
#[path = "nexmark_tests.rs"]
mod tests;
