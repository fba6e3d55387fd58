"""The chat page of rgml serve in a real browser (Debian's Chromium, headless, driven through
chromedriver by Selenium): type a message, send it, see the answer stream in. With KEY (a server
started with --api-key KEY), the page first asks for the key; it is typed in, and the chat works.

usage: browser.py BASE_URL [KEY]
"""
import sys
import time

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

BASE = sys.argv[1]
KEY = sys.argv[2] if len(sys.argv) > 2 else None
options = webdriver.ChromeOptions()
options.binary_location = "/usr/bin/chromium"
for arg in ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]:
    options.add_argument(arg)
driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
try:
    driver.get(BASE + "/")
    if KEY is not None:
        # The page's first request is refused: it shows the key field.
        deadline = time.time() + 30
        while not driver.find_element(By.ID, "keyform").is_displayed():
            assert time.time() < deadline, "the page did not ask for the API key"
            time.sleep(0.05)
        driver.find_element(By.ID, "apikey").send_keys(KEY)
        driver.find_element(By.ID, "usekey").click()
        assert not driver.find_element(By.ID, "keyform").is_displayed()
    box = driver.find_element(By.ID, "input")
    box.send_keys("Write a short poem about the sea.")
    driver.find_element(By.ID, "send").click()
    # The answer grows while it streams, then is marked done.
    lengths, deadline = set(), time.time() + 120
    done = None
    while time.time() < deadline:
        bubbles = driver.find_elements(By.CSS_SELECTOR, "#messages .assistant")
        if bubbles:
            lengths.add(len(bubbles[-1].text))
            if bubbles[-1].get_attribute("data-done") == "true":
                done = bubbles[-1].text
                break
        time.sleep(0.02)
    assert done is not None, "the answer did not finish"
    assert done.strip(), "the answer is empty"
    partial = [n for n in lengths if 0 < n < len(done)]
    assert partial, f"no partial answer was seen while streaming (lengths {sorted(lengths)})"
    user = driver.find_elements(By.CSS_SELECTOR, "#messages .user")
    assert user and "poem about the sea" in user[-1].text, "the user's message is shown"
    print(f"streamed {len(done)} characters in {len(partial)} visible steps", file=sys.stderr)
finally:
    driver.quit()
