//! Checks of the examples' numeric flags, as clap value parsers
//! (`#[arg(long, value_parser = positive)]`): what a number must be for the flag to mean
//! anything, said in the error.

/// A number above 0 (a rate, a duration), spaces around it ignored (`--rates "500, 1000"`).
pub fn positive(v: &str) -> Result<f64, String> {
    v.trim()
        .parse::<f64>()
        .ok()
        .filter(|v| *v > 0.0)
        .ok_or_else(|| format!("`{v}` is not a positive number"))
}

/// A finite number of at least 0 (0 often turns a phase off), spaces around it ignored.
pub fn non_negative(v: &str) -> Result<f64, String> {
    v.trim()
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v >= 0.0)
        .ok_or_else(|| format!("`{v}` is not a number ≥ 0"))
}

#[cfg(test)]
mod tests {
    use super::{non_negative, positive};

    #[test]
    fn tells_numbers_from_the_rest() {
        assert_eq!(positive(" 500 "), Ok(500.0));
        assert!(positive("0").is_err() && positive("-1").is_err() && positive("x").is_err());
        assert_eq!(non_negative("0"), Ok(0.0));
        assert!(non_negative("-0.5").is_err() && non_negative("inf").is_err());
    }
}
