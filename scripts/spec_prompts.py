"""The prompts of scripts/bench_spec.py, plain text for a base model (Gemma 3 270M) on /v1/completions.

GROUNDED: (name, prompt) pairs whose greedy continuation mostly copies spans of the prompt (code with a name
changed, fields pulled out as JSON, a sentence quoted, a config echoed with one value changed, a list
repeated): what prompt-lookup drafting should speed up. FREE: story openings, continued at temperature 0.8,
where drafts should rarely be accepted: what speculation must not slow down.
"""
from __future__ import annotations

CODE = '''def summarize_orders(items, min_total=0.0, currency="EUR"):
    """Groups the orders by customer and returns the totals above min_total."""
    totals = {}
    counts = {}
    for order in items:
        customer = order["customer"]
        amount = float(order["amount"])
        if order.get("currency", currency) != currency:
            amount = convert(amount, order["currency"], currency)
        totals[customer] = totals.get(customer, 0.0) + amount
        counts[customer] = counts.get(customer, 0) + 1
    result = []
    for customer, total in sorted(totals.items()):
        if total < min_total:
            continue
        average = total / counts[customer]
        result.append({"customer": customer, "total": round(total, 2),
                       "orders": counts[customer], "average": round(average, 2)})
    result.sort(key=lambda row: row["total"], reverse=True)
    return result


def convert(amount, source, target):
    """Converts amount from the source currency to the target one at fixed rates."""
    rates = {"EUR": 1.0, "USD": 0.92, "GBP": 1.17, "CHF": 1.04}
    if source not in rates or target not in rates:
        raise ValueError(f"unknown currency: {source} or {target}")
    return amount * rates[source] / rates[target]
'''

CONFIG = """[server]
host = 0.0.0.0
port = 8080
workers = 4
timeout_seconds = 30
log_level = info

[database]
url = postgresql://app:secret@db.internal:5432/orders
pool_size = 10
pool_timeout = 5
echo = false

[cache]
backend = redis
url = redis://cache.internal:6379/0
ttl_seconds = 600
max_entries = 10000

[features]
new_checkout = true
beta_reports = false
dark_mode = true
"""

ARTICLE = ("The Harbour Bridge Project began in March 2019 after three years of planning. The city council approved "
           "a budget of 412 million euros, most of it from a regional transport fund. Construction was led by "
           "Nordvik Engineering, a firm based in Bergen that had built two similar bridges in Norway. The main span "
           "is 1,140 metres long and rises 58 metres above the water, enough for cargo ships to pass beneath it. "
           "Work stopped for seven months in 2020 because of supply problems with the steel cables. The bridge "
           "finally opened to traffic on 14 June 2023, carrying about 38,000 vehicles a day in its first year. "
           "Engineers expect it to last at least 120 years with regular maintenance.")

PROFILE = ("Dr. Amelia Okafor, 47, is a marine biologist at the University of Plymouth, where she has worked "
           "since 2011. She was born in Lagos, Nigeria, and studied at the University of Cape Town before "
           "completing her doctorate at Oxford in 2008. Her research focuses on coral reef recovery in the "
           "Indian Ocean. She can be reached at amelia.okafor@plymouth.ac.uk or on +44 1752 600 600. She "
           "currently leads a team of nine researchers and holds a grant of 2.3 million pounds from the "
           "Natural Environment Research Council.")

CITIES = ("Lisbon, Madrid, Barcelona, Marseille, Lyon, Geneva, Zurich, Milan, Venice, Vienna, Prague, Berlin, "
          "Hamburg, Copenhagen, Stockholm, Oslo, Helsinki, Tallinn, Riga, Vilnius, Warsaw, Krakow, Budapest, "
          "Belgrade, Sofia, Bucharest, Athens, Istanbul, Ankara, Tbilisi")

ORDERS = "\n".join(f"{1040 + i},{c},{city},{a:.2f},{st}" for i, (c, city, a, st) in enumerate([
    ("Ana Lima", "Porto", 129.5, "shipped"), ("Ben Okoro", "Leeds", 42.0, "pending"),
    ("Chloe Martin", "Lyon", 310.25, "shipped"), ("Dev Patel", "Pune", 18.99, "cancelled"),
    ("Eva Novak", "Brno", 75.4, "shipped"), ("Farid Haddad", "Tunis", 560.0, "pending"),
    ("Greta Lund", "Malmo", 99.9, "shipped"), ("Hugo Silva", "Braga", 240.0, "returned"),
    ("Ines Duarte", "Faro", 12.5, "shipped"), ("Jonas Berg", "Bergen", 88.8, "pending")]))

GROUNDED = [
    ("code rename", f"Here is a Python module:\n```python\n{CODE}```\n\nHere is the same module with the "
                    f"parameter `items` renamed to `orders`, and nothing else changed:\n```python\n"),
    ("config edit", f"Current configuration file:\n```ini\n{CONFIG}```\n\nThe same file with the port changed "
                    f"to 9090 and every other line unchanged:\n```ini\n"),
    ("json extract", f"Text:\n{PROFILE}\n\nThe fields from the text as JSON, with values copied word for word "
                     f"(name, age, job, employer, since, born_in, studied_at, doctorate, research, email, phone, "
                     f"team_size, grant):\n```json\n{{\n  \"name\": \""),
    ("quote answer", f"Article:\n{ARTICLE}\n\nQuestion: When did the bridge open, how many vehicles did it carry "
                     f"and how long should it last?\nThe sentences of the article that answer the question, "
                     f"quoted exactly:\n\""),
    ("list repeat", f"Cities on the route, in order: {CITIES}.\n\nThe same cities in the same order, one per "
                    f"line, numbered:\n1. Lisbon\n2."),
    ("article echo", f"Original text:\n{ARTICLE}\n\nThe same text copied exactly, with \"euros\" written as "
                     f"\"EUR\":\n"),
    ("csv to table", f"Orders as CSV:\n{ORDERS}\nThe same orders as a Markdown table:\n"
                     f"| id | customer | city | amount | status |\n|---|---|---|---|---|\n"
                     f"| 1040 | Ana Lima | Porto | 129.50 | shipped |\n|"),
]

FREE = [
    "The lighthouse keeper had not seen a ship in eleven days when",
    "On the morning of her sixtieth birthday, Mara packed a single suitcase and",
    "Nobody in the village remembered who had planted the orchard, but every autumn",
    "The robot was designed to sort mail, and for twenty years that is all it did, until",
    "Rain had fallen on the city for a month. In the flooded market, a boy with a lantern",
    "The letter arrived forty years late, its envelope yellow and its stamp from a country that",
    "When the old clockmaker died, his apprentice found a locked drawer that",
    "Captain Ilse Varga read the message twice before she ordered the ship to turn around, because",
]
