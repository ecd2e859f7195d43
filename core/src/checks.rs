//! Config checks several config types share, each naming the keys it
//! compares so the message points at the file's own words.

use std::fmt;

/// Config validation: `Err("{upper} (..) must be >= {lower} (..)")`, with
/// both values, when the value named `upper` is below the one named `lower`.
pub fn check_at_least<T: PartialOrd + fmt::Debug>(
    (upper, upper_value): (&str, T),
    (lower, lower_value): (&str, T),
) -> Result<(), String> {
    if upper_value < lower_value {
        return Err(format!(
            "{upper} ({upper_value:?}) must be >= {lower} ({lower_value:?})"
        ));
    }
    Ok(())
}

/// The longest an ADD may wait for an ENI or address on its way (the
/// pools' `allocate_wait`): the rest of the ADD must fit in the plugin's
/// default 30 s timeout (`timeoutSeconds`).
pub const MAX_ALLOCATE_WAIT: std::time::Duration = std::time::Duration::from_secs(25);

/// Checks a pool's `allocate_wait` against [`MAX_ALLOCATE_WAIT`].
pub fn check_allocate_wait(wait: std::time::Duration) -> Result<(), String> {
    if wait > MAX_ALLOCATE_WAIT {
        return Err(format!(
            "allocate_wait ({wait:?}) must be at most {MAX_ALLOCATE_WAIT:?}: the rest of an ADD must fit in the plugin's 30 s timeout"
        ));
    }
    Ok(())
}
