//! The outbox table a relay works on, and the names derived from it.

use std::fmt;

/// A validated outbox table name: `name` or `schema.name`, each part an SQL identifier of
/// `[A-Za-z_][A-Za-z0-9_]*`. The dead-letter table is `<name>_dead` in the same schema, and
/// the insert trigger notifies channel `<table as given>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableName {
    schema: Option<String>,
    name: String,
}

/// Postgres truncates identifiers at 63 bytes; `_dead` must still fit.
const MAX_NAME: usize = 63 - "_dead".len();

impl TableName {
    /// Parses and validates a table name; the error says what is wrong.
    pub fn parse(s: &str) -> Result<Self, String> {
        let parts: Vec<&str> = s.split('.').collect();
        let (schema, name) = match parts.as_slice() {
            [name] => (None, *name),
            [schema, name] => (Some(*schema), *name),
            _ => return Err(format!("{s:?} is neither `table` nor `schema.table`")),
        };
        for part in schema.iter().chain(std::iter::once(&name)) {
            let ok = part
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !ok {
                return Err(format!(
                    "{part:?} is not a plain SQL identifier ([A-Za-z_][A-Za-z0-9_]*)"
                ));
            }
        }
        if name.len() > MAX_NAME || schema.is_some_and(|s| s.len() > 63) {
            return Err(format!(
                "{s:?} is too long: the table name may have at most {MAX_NAME} characters"
            ));
        }
        Ok(TableName {
            schema: schema.map(str::to_owned),
            name: name.to_owned(),
        })
    }

    /// The outbox table, quoted for SQL.
    pub fn pending(&self) -> String {
        self.quoted(&self.name)
    }

    /// The dead-letter table, quoted for SQL.
    pub fn dead(&self) -> String {
        self.quoted(&format!("{}_dead", self.name))
    }

    /// The NOTIFY channel of the insert trigger: the table name as given.
    pub fn channel(&self) -> String {
        self.to_string()
    }

    fn quoted(&self, name: &str) -> String {
        match &self.schema {
            Some(s) => format!("\"{s}\".\"{name}\""),
            None => format!("\"{name}\""),
        }
    }
}

impl Default for TableName {
    fn default() -> Self {
        TableName {
            schema: None,
            name: "pending_jobs".into(),
        }
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.schema {
            Some(s) => write!(f, "{s}.{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        let t = TableName::parse("pending_jobs").unwrap();
        assert_eq!(t.pending(), "\"pending_jobs\"");
        assert_eq!(t.dead(), "\"pending_jobs_dead\"");
        assert_eq!(t.channel(), "pending_jobs");
        let t = TableName::parse("billing.jobs").unwrap();
        assert_eq!(t.dead(), "\"billing\".\"jobs_dead\"");
        assert_eq!(t.channel(), "billing.jobs");
        assert!(TableName::parse("a.b.c").is_err());
        assert!(TableName::parse("jobs; drop table x").is_err());
        assert!(TableName::parse("1jobs").is_err());
        assert!(TableName::parse("").is_err());
        assert!(TableName::parse(&"x".repeat(59)).is_err());
    }
}
