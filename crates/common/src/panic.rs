//! Panics turned into errors at the boundaries that must survive them: a session's statement,
//! a view's operators, the restore of a view at start-up. A panic is a bug (XX000), but one
//! view's or statement's bug never takes the others down.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::Error;

/// The message a panic carried (`panic!("...")` gives a `&str` or a `String`).
pub fn panic_message(panic: &(dyn Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// Runs `f`, turning a panic into an internal error saying `what` panicked. The state `f`
/// touched may be half-updated: callers drop it (a view is marked failed, a restore is
/// abandoned) rather than keep using it.
pub fn catch_panic<T>(what: &str, f: impl FnOnce() -> crate::Result<T>) -> crate::Result<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(result) => result,
        Err(panic) => Err(panic_error(what, panic.as_ref())),
    }
}

/// The error a caught panic becomes.
pub fn panic_error(what: &str, panic: &(dyn Any + Send)) -> Error {
    Error::internal(format!("{what} panicked: {}", panic_message(panic)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_an_internal_error() {
        let e =
            catch_panic::<()>("restoring view v", || panic!("index out of bounds")).unwrap_err();
        assert_eq!(e.state, crate::SqlState::INTERNAL_ERROR);
        assert!(
            e.message.contains("restoring view v panicked"),
            "{}",
            e.message
        );
        assert!(e.message.contains("index out of bounds"), "{}", e.message);
        assert_eq!(catch_panic("x", || Ok(3)).unwrap(), 3);
    }
}
